"""The staging area of blob files on its own: the token and lock file a writer takes
with its first staged file, and which files ``remove_stale`` removes (a dead writer's,
old enough where the directory is shared; untokened ones after a day) and which it
never touches (its own, a live writer's, anything not named as a staged file)."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import pathlib
import re
import stat
import time
from typing import Any

import pytest

from zodbsql.storage.staging import StagingArea

# staging imports os, time and fcntl whole: patching those modules patches its calls.

storage_backends = ("sqlite",)
storage_backends_reason = "staging is files in the blob directory, the same on every backend"

DAY = 86400.0
HOUR = 3600.0


@pytest.fixture
def folders(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    directory, lock_dir = tmp_path / "tmp", tmp_path
    directory.mkdir()
    return directory, lock_dir


def area(folders: tuple[pathlib.Path, pathlib.Path], shared: bool = False) -> StagingArea:
    return StagingArea(str(folders[0]), str(folders[1]), shared=shared)


def lock_files(lock_dir: pathlib.Path) -> set[str]:
    return {p.name for p in lock_dir.glob(".commit-*.lock")}


def names(directory: pathlib.Path) -> set[str]:
    return set(os.listdir(directory))


def is_locked(path: pathlib.Path) -> bool:
    """Does another open file description hold ``path``'s flock?"""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def dead_writer(folders: tuple[pathlib.Path, pathlib.Path], count: int = 1,
                keep_lock: bool = True) -> tuple[str, list[str]]:
    """Files staged by a writer whose storage is gone without closing (its lock file
    left, unlocked) or, ``keep_lock=False``, whose lock file is gone too."""
    writer = area(folders)
    files = [os.path.basename(writer.new_file()) for _ in range(count)]
    token = writer.token
    assert token is not None
    os.close(writer._lock_fd)          # the kernel drops the lock of a dead process
    if not keep_lock:
        os.remove(folders[1] / f".commit-{token}.lock")
    return token, files


def later(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The clock ``seconds`` ahead: every file is that much older."""
    now = time.time()
    monkeypatch.setattr(time, "time", lambda: now + seconds)


def test_the_first_file_takes_a_token_and_its_lock(folders: Any) -> None:
    directory, lock_dir = folders
    staging_area = area(folders)
    assert staging_area.token is None and lock_files(lock_dir) == set()
    first = pathlib.Path(staging_area.new_file())
    token = staging_area.token
    assert token is not None and re.fullmatch(r"[0-9a-f]{16}", token)
    assert first.parent == directory and first.stat().st_size == 0
    assert re.fullmatch(rf"commit-{token}-.+\.blob", first.name)
    lock = lock_dir / f".commit-{token}.lock"
    assert lock_files(lock_dir) == {lock.name}
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert is_locked(lock)
    second = pathlib.Path(staging_area.new_file())
    assert second != first and second.name.startswith(f"commit-{token}-")
    assert staging_area.token == token and lock_files(lock_dir) == {lock.name}
    staging_area.close()


def test_close_releases_and_removes_the_lock(folders: Any) -> None:
    _, lock_dir = folders
    staging_area = area(folders)
    staging_area.close()                      # nothing taken: nothing to do
    staging_area.new_file()
    fd = staging_area._lock_fd
    staging_area.close()
    assert staging_area.token is None and staging_area._lock_fd == -1
    assert lock_files(lock_dir) == set()
    with pytest.raises(OSError):
        os.fstat(fd)                          # closed
    staging_area.close()                      # twice: nothing more
    staging_area.new_file()                   # a new token after a close
    assert staging_area.token is not None and len(lock_files(lock_dir)) == 1
    staging_area.close()


def test_a_forked_child_closing_leaves_the_parents_lock_file(folders: Any) -> None:
    _, lock_dir = folders
    staging_area = area(folders)
    staging_area.new_file()
    lock = lock_dir / f".commit-{staging_area.token}.lock"
    staging_area._pid = os.getpid() + 1      # as in a child: the lock is the parent's
    staging_area.close()
    assert lock.exists()
    assert staging_area.token is None and staging_area._lock_fd == -1


def test_a_token_whose_lock_file_a_cleaner_removed_is_not_kept(
        folders: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A cleaner that took the new lock file's flock first saw it unheld and removed it:
    # the writer, locking it next, must take another token.
    _, lock_dir = folders
    real_flock = fcntl.flock
    calls: list[int] = []

    def cleaner_first(fd: int, operation: int) -> None:
        if not calls:
            (path,) = lock_dir.glob(".commit-*.lock")
            path.unlink()
        calls.append(fd)
        real_flock(fd, operation)

    real_close = os.close
    closed: list[int] = []

    def recorded_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(fcntl, "flock", cleaner_first)
    monkeypatch.setattr(os, "close", recorded_close)
    staging_area = area(folders)
    staging_area.new_file()
    assert len(calls) == 2
    assert lock_files(lock_dir) == {f".commit-{staging_area.token}.lock"}
    assert closed[0] == calls[0]              # the first token's descriptor, closed
    assert staging_area._lock_fd == calls[1] and is_locked(
        lock_dir / f".commit-{staging_area.token}.lock")
    staging_area.close()


def test_a_dead_writers_files_and_lock_go_and_are_counted(
        folders: Any, caplog: pytest.LogCaptureFixture) -> None:
    directory, lock_dir = folders
    token, files = dead_writer(folders, count=2)
    live = area(folders)
    live_file = os.path.basename(live.new_file())
    cleaner = area(folders)
    with caplog.at_level(logging.INFO, logger="zodbsql.storage.staging"):
        assert cleaner.remove_stale() == 2
    assert names(directory) == {live_file}
    assert lock_files(lock_dir) == {f".commit-{live.token}.lock"}
    assert [r.getMessage() for r in caplog.records] == [
        f"removed 2 blob file(s) that killed commits left in {directory}"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zodbsql.storage.staging"):
        assert cleaner.remove_stale() == 0
    assert caplog.records == []               # nothing removed: nothing said
    live.close()


def test_its_own_files_are_never_removed(folders: Any) -> None:
    directory, lock_dir = folders
    staging_area = area(folders)
    own = os.path.basename(staging_area.new_file())
    # Its own lock is held by this very descriptor: flock from it would succeed.
    assert staging_area.remove_stale() == 0
    assert names(directory) == {own}
    assert lock_files(lock_dir) == {f".commit-{staging_area.token}.lock"}
    staging_area.close()


def test_files_whose_lock_file_is_gone_go(folders: Any,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = folders
    dead_writer(folders, count=3, keep_lock=False)
    closed: list[int] = []
    real_close = os.close

    def recorded_close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(os, "close", recorded_close)
    assert area(folders).remove_stale() == 3
    assert names(directory) == set()
    assert closed == []                      # no lock file opened: no descriptor closed


def test_the_files_of_every_dead_writer_are_counted(folders: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    directory, lock_dir = folders
    dead_writer(folders, count=2)
    dead_writer(folders, count=3, keep_lock=False)
    dead_writer(folders, count=1)
    (directory / "commit-old.blob").write_bytes(b"x")
    later(monkeypatch, DAY)
    assert area(folders).remove_stale() == 7
    assert names(directory) == set() and lock_files(lock_dir) == set()


def test_a_staging_area_is_not_shared_unless_told(folders: Any) -> None:
    directory, _ = folders
    dead_writer(folders)
    # A fresh dead writer's file: a shared directory would keep it for an hour.
    assert StagingArea(str(directory), str(folders[1])).remove_stale() == 1


def test_a_lock_file_another_cleaner_removed_first(folders: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    directory, lock_dir = folders
    token, files = dead_writer(folders)
    real_remove = os.remove

    def raced(path: str) -> None:
        real_remove(path)
        if path.endswith(".lock"):
            raise FileNotFoundError(path)     # as if the other cleaner was first

    monkeypatch.setattr(os, "remove", raced)
    assert area(folders).remove_stale() == 1
    assert names(directory) == set() and lock_files(lock_dir) == set()


def test_a_lock_file_without_files_goes(folders: Any) -> None:
    directory, lock_dir = folders
    token, files = dead_writer(folders)
    os.remove(directory / files[0])          # its commit had finished
    assert area(folders).remove_stale() == 0
    assert lock_files(lock_dir) == set()


def test_a_shared_directory_waits_an_hour(folders: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    directory, lock_dir = folders
    token, files = dead_writer(folders, count=2)
    cleaner = area(folders, shared=True)
    later(monkeypatch, HOUR - 5)
    assert cleaner.remove_stale() == 0
    assert names(directory) == set(files)
    assert lock_files(lock_dir) == {f".commit-{token}.lock"}   # kept with its files
    later(monkeypatch, 10)                   # an hour and five seconds
    assert cleaner.remove_stale() == 2
    assert names(directory) == set() and lock_files(lock_dir) == set()


def test_a_shared_directory_removes_a_file_of_exactly_an_hour(
        folders: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = folders
    token, (name,) = dead_writer(folders)
    made = 1_700_000_000.0                    # whole seconds: the difference is exact
    monkeypatch.setattr(os, "lstat", lambda path: os.stat_result((0,) * 9 + (made,)))
    monkeypatch.setattr(time, "time", lambda: made + HOUR)
    assert area(folders, shared=True).remove_stale() == 1
    assert names(directory) == set()


def test_a_shared_directory_keeps_the_lock_of_files_it_kept(
        folders: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, lock_dir = folders
    token, (old, young) = dead_writer(folders, count=2)
    hour_ago = time.time() - HOUR - 60
    monkeypatch.setattr(os, "lstat", lambda path: os.stat_result(
        (0,) * 9 + (hour_ago if path.endswith(old) else time.time(),)))
    assert area(folders, shared=True).remove_stale() == 1
    assert names(directory) == {young}
    assert lock_files(lock_dir) == {f".commit-{token}.lock"}


def test_a_live_writers_files_stay_on_a_shared_directory_too(
        folders: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, lock_dir = folders
    live = area(folders, shared=True)
    live_file = os.path.basename(live.new_file())
    later(monkeypatch, 2 * DAY)
    assert area(folders, shared=True).remove_stale() == 0
    assert names(directory) == {live_file}
    live.close()


def test_untokened_files_go_after_a_day(folders: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = folders
    for name in ("commit-abc.blob", "commit-.blob"):
        (directory / name).write_bytes(b"x")
    cleaner = area(folders)
    later(monkeypatch, DAY - 5)
    assert cleaner.remove_stale() == 0
    assert names(directory) == {"commit-abc.blob", "commit-.blob"}
    later(monkeypatch, 10)
    assert cleaner.remove_stale() == 2
    assert names(directory) == set()


def test_other_files_are_never_removed(folders: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    directory, lock_dir = folders
    others = ["upload-1.blob", "commit-0123456789abcdef-x.tmp", "commit-a-b.blob",
              "commit-0123456789ABCDEF-x.blob", "xcommit-abc.blob", "commit-abc.blobx",
              "commit-0123456789abcdef-x.blob.part"]
    for name in others:
        (directory / name).write_bytes(b"x")
    (lock_dir / ".commit-0123456789abcdef.lock.old").write_bytes(b"")
    later(monkeypatch, 2 * DAY)
    assert area(folders).remove_stale() == 0
    assert names(directory) == set(others)
    assert (lock_dir / ".commit-0123456789abcdef.lock.old").exists()


def test_nothing_to_clean_in_a_missing_directory(tmp_path: pathlib.Path) -> None:
    assert StagingArea(str(tmp_path / "none"), str(tmp_path)).remove_stale() == 0
    (tmp_path / "tmp").mkdir()
    assert StagingArea(str(tmp_path / "tmp"), str(tmp_path / "none")).remove_stale() == 0


def test_a_lock_that_cannot_be_opened_keeps_its_files(
        folders: Any, caplog: pytest.LogCaptureFixture) -> None:
    directory, lock_dir = folders
    token, files = dead_writer(folders)
    lock = lock_dir / f".commit-{token}.lock"
    lock.unlink()
    lock.symlink_to(lock_dir / "elsewhere")  # refused: never followed
    with caplog.at_level(logging.WARNING, logger="zodbsql.storage.staging"):
        assert area(folders).remove_stale() == 0
    assert names(directory) == set(files)
    (record,) = caplog.records
    assert record.getMessage() == (
        f"cannot check {lock}: [Errno {errno.ELOOP}] {os.strerror(errno.ELOOP)}: '{lock}'")


def test_a_lock_error_other_than_held_is_raised(folders: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = folders
    token, files = dead_writer(folders)

    def failing(fd: int, operation: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fcntl, "flock", failing)
    with pytest.raises(OSError, match="Input/output"):
        area(folders).remove_stale()
    assert names(directory) == set(files)


@pytest.mark.parametrize("errno_name", ["EAGAIN", "EACCES"])
def test_a_lock_held_elsewhere_keeps_its_files(folders: Any, monkeypatch: pytest.MonkeyPatch,
                                               errno_name: str) -> None:
    # EACCES: what some systems' flock answers for a lock another holds.
    directory, _ = folders
    token, files = dead_writer(folders)

    def held(fd: int, operation: int) -> None:
        raise OSError(getattr(errno, errno_name), "held")

    monkeypatch.setattr(fcntl, "flock", held)
    assert area(folders).remove_stale() == 0
    assert names(directory) == set(files)


def test_a_file_that_vanishes_meanwhile_is_not_counted(
        folders: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another cleaner (or the writer's commit) removed it between listing and removal.
    directory, lock_dir = folders
    token, (gone, kept) = dead_writer(folders, count=2)
    real_remove = os.remove

    def racing(path: str) -> None:
        if path.endswith(gone):
            real_remove(path)
        real_remove(path)

    monkeypatch.setattr(os, "remove", racing)
    assert area(folders).remove_stale() == 1
    assert names(directory) == set()
    # One of two counted: its lock file stays for the next cleaner to see.
    assert lock_files(lock_dir) == {f".commit-{token}.lock"}


def test_a_file_that_vanishes_before_its_age_is_read_is_kept_out(
        folders: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, _ = folders
    (directory / "commit-abc.blob").write_bytes(b"x")
    later(monkeypatch, 2 * DAY)

    def vanished(path: str) -> os.stat_result:
        raise FileNotFoundError(path)

    monkeypatch.setattr(os, "lstat", vanished)
    assert area(folders).remove_stale() == 0
    assert names(directory) == {"commit-abc.blob"}
