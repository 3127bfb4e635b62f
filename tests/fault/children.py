"""Child processes of the fault tests: started with a JSON config, watched through the
lines they print, killed with SIGKILL.

A child prints one line per event on stdout (``ready``, ``phase vote``, ``done``...);
``wait_for`` returns the first line with a given first word, or fails with the child's
stderr when it exits or times out first.  Children import this checkout (``tests`` and
whatever ``zodbsql`` the parent imported) through PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import zodbsql

ROOT = pathlib.Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """The environment of a child: this checkout's tests and the parent's zodbsql first."""
    source = str(pathlib.Path(zodbsql.__file__).resolve().parents[1])
    paths = [str(ROOT), source] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def zodbsql_command() -> list[str]:
    """How to run the ``zodbsql`` command line of the zodbsql under test."""
    return [sys.executable, "-m", "zodbsql.cli.main"]


class Child:
    """``python -m MODULE CONFIG_JSON`` with its stdout read line by line."""

    def __init__(self, module: str, config: dict[str, Any], log: pathlib.Path,
                 preexec: Any = None) -> None:
        self.log = log
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.seen: list[str] = []
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, json.dumps(config)], cwd=ROOT,
                env=child_env(), stdout=subprocess.PIPE, stderr=stderr, text=True,
                preexec_fn=preexec)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, word: str, timeout: float = 60.0) -> str:
        """The next line starting with ``word`` (earlier lines are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"no {word!r} from the child within {timeout}s"
                                     f"\n{self.stderr_tail()}") from None
            if line is None:
                self.process.wait(10)
                raise AssertionError(
                    f"the child exited ({self.process.returncode}) before {word!r}"
                    f"\n{self.stderr_tail()}")
            self.seen.append(line)
            if line.split(" ", 1)[0] == word:
                return line

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the child did not end within {timeout}s"
                                 f"\n{self.stderr_tail()}") from None

    def rest(self) -> list[str]:
        """Every line printed after the ones ``wait_for`` consumed (child ended)."""
        lines: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=10)
            except queue.Empty:
                return lines
            if line is None:
                return lines
            lines.append(line)

    def stderr_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no stderr)"
        return "child stderr:\n" + "\n".join(text.splitlines()[-lines:])
