"""A TCP relay in front of a test server that the test can cut and restore: to the
storage behind it the server goes down (sessions dropped, connections refused) and
comes back on the same port.  ``check_outage`` is what a storage must do meanwhile."""
from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pytest
from transaction.interfaces import TransientError
from ZODB.POSException import POSKeyError
from ZODB.utils import z64

from zodbsql.errors import ConnectionLost


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (for a moment)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.start()

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen()
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """The server is gone: the port refuses connections, open sessions break."""
        if self._listener is not None:
            # shutdown wakes the thread blocked in accept(); close alone would not.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.cut()


def check_outage(storage: Any, relay: Relay, secret: str = "") -> None:
    """Cut ``relay`` under ``storage`` (opened through it): the broken session, then the
    reconnect tried while the server is down, raise the retryable ConnectionLost naming
    the server (and never ``secret``); restored, the server answers again."""
    relay.cut()
    with pytest.raises(ConnectionLost):  # the session broke
        storage.load(z64)
    with pytest.raises(ConnectionLost) as info:  # the reconnect: nothing listens
        storage.load(z64)
    assert isinstance(info.value, TransientError)
    assert f"127.0.0.1:{relay.port}" in str(info.value)
    assert not secret or secret not in str(info.value)
    relay.start()
    with pytest.raises(POSKeyError):  # back: there is no root yet, but an answer
        storage.load(z64)
