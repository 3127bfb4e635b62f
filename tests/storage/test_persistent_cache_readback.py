"""The persistent cache's thread (``zodbsql.cache.persistent``): what it adopts from the
file and what it refuses, what it says in the log, when it saves, how it paces itself.

``tests/storage/test_persistent_cache.py`` has the restarts themselves; here the file is
also forged (states that are not the database's, at a tid the database never reached)
to see that the read-back's check, not luck, keeps them out.
"""
from __future__ import annotations

import logging
import pathlib
import re
import threading
import time
from typing import Any

import pytest
import ZODB
from persistent.mapping import PersistentMapping
from ZODB.Connection import TransactionMetaData
from ZODB.POSException import POSKeyError
from ZODB.serialize import referencesf
from ZODB.utils import u64

from zodbsql.cache import StateCache, cachefile, persistent
from zodbsql.cache.cachefile import Segment
from zodbsql.cache.persistent import Breather, PersistentCache
from zodbsql.storage import SQLStorage

from tests.storage.test_persistent_cache import (COUNT, filled_and_saved, loaded,
                                                 open_cached, read_all)


def reading(storage: SQLStorage, count: int = COUNT) -> Any:
    """A ZODB.DB on ``storage`` whose connection read ``count`` objects (the storage
    polled and cached them); closing it closes the storage."""
    db = ZODB.DB(storage)
    conn = db.open()
    assert [conn.root()[i]["value"] for i in range(count)] == list(range(count))
    conn.close()
    return db


def the_file(directory: pathlib.Path) -> pathlib.Path:
    (path,) = directory.glob("*.states")
    return path


def test_every_state_of_the_file_is_adopted(storage_factory, tmp_path):
    """Nothing changed since the save: each state the file holds is adopted, once."""
    directory = filled_and_saved(storage_factory, tmp_path)
    _, segments = cachefile.decode(the_file(directory).read_bytes())
    held = sum(len(segment.entries) for segment in segments)
    assert held >= COUNT + 1                        # the root too
    second = loaded(open_cached(storage_factory, directory, prefetch_count=0))
    cache_file = second.shared.persistent
    assert cache_file is not None
    assert cache_file.found == cache_file.adopted == held
    assert cache_file.changes == 0
    second.close()


def test_a_file_newer_than_the_database_is_not_adopted(storage_factory, tmp_path, caplog):
    """The database was restored from a backup older than the file (same database, no
    pack since): the file's states, here each another object's state stamped at a tid
    the database never reached, are not taken, and the log says the file was not used."""
    directory = filled_and_saved(storage_factory, tmp_path)
    path = the_file(directory)
    identity, segments = cachefile.decode(path.read_bytes())
    ahead = max(segment.as_of for segment in segments) + (1 << 40)
    entries = [entry for segment in segments for entry in segment.entries]
    # Each oid given the next one's state: pickles that load, values that are wrong.
    forged = [(oid, ahead, ahead.to_bytes(8, "big") + entries[(at + 1) % len(entries)][2][8:])
              for at, (oid, _, _) in enumerate(entries)]
    path.write_bytes(cachefile.encode(identity, [Segment(ahead, forged)]))
    with caplog.at_level(logging.INFO, logger="zodbsql"):
        second = loaded(open_cached(storage_factory, directory, prefetch_count=0))
    cache_file = second.shared.persistent
    assert cache_file is not None
    assert (cache_file.found, cache_file.adopted) == (len(forged), 0)
    assert read_all(second)[0] == {i: i for i in range(COUNT)}
    said = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert said == [f"zodbsql: state cache file {path} not used: the database is older"
                    " than the file (restored from a backup?)"]
    # Asked again before any poll of the storage: refused by the same check.
    assert opened_beside(second, directory).load() == 0
    second.close()


def test_load_answers_how_many_states_it_adopted(storage_factory, tmp_path, caplog):
    """``load`` by a new file object beside a running storage: every state when the
    file is whole and unchanged; none when it is missing, damaged, or holds nothing
    the database can vouch for; the warning names the file and why."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = loaded(open_cached(storage_factory, directory))
    path = the_file(directory)
    data = path.read_bytes()
    identity, segments = cachefile.decode(data)
    storage.shared.cache.clear()
    db = reading(storage, 1)                        # the cache has polled since the save
    cache = storage.shared.cache
    # What the read above brought is held already: the rest is adopted.
    missing = [oid for s in segments for oid, _, _ in s.entries
               if not cache.has(oid, cache.polled)]
    assert COUNT - 10 < len(missing) < COUNT
    assert opened_beside(storage, directory).load() == len(missing)
    assert all(cache.has(oid, cache.polled) for oid in missing)
    path.unlink()
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        assert opened_beside(storage, directory).load() == 0    # no file, no warning
    assert caplog.records == []
    path.write_bytes(data[:-1])
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        assert opened_beside(storage, directory).load() == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"zodbsql: ignoring the state cache file {path}: its checksum does not match"
        " (truncated or corrupt)"]
    newest = max(segment.as_of for segment in segments)
    for held in ([], [(1, 5, (5).to_bytes(8, "big") + b"forged")]):
        # A segment of nothing, or one newer than the database: nothing adopted.
        path.write_bytes(cachefile.encode(identity, [Segment(newest + (1 << 40), held)]))
        assert opened_beside(storage, directory).load() == 0
    db.close()


def opened_beside(storage: SQLStorage, directory: pathlib.Path, interval: float = 3600.0,
                  connect: Any = None) -> PersistentCache:
    """A file object for ``storage``'s cache, in ``directory``, not started; its
    identity is that of the file there."""
    shared = storage.shared
    model = shared.persistent
    if model is not None:
        identity = model.identity
    else:
        identity, _ = cachefile.decode(the_file(directory).read_bytes())
    return PersistentCache(str(directory), identity, shared.cache, shared.backend,
                           connect or shared.connect, interval)


def change(factory: Any, values: dict[int, Any], new: int = 0) -> None:
    """Another process changes the root's objects ``values`` names, and adds ``new``
    objects in a container of their own."""
    db = ZODB.DB(factory.open())
    with db.transaction() as conn:
        root = conn.root()
        for key, new_value in values.items():
            root[key]["value"] = new_value
        if new:
            root["many"] = PersistentMapping({i: PersistentMapping(value=i)
                                              for i in range(new)})
    db.close()


def test_too_many_changes_while_down_leave_the_file_unused(storage_factory, tmp_path,
                                                           caplog):
    """More objects changed since the save than the read-back's poll may list (the
    cache's index limit): the file is not used, and no state of it is served, not even
    of the objects the truncated poll did not name."""
    directory = filled_and_saved(storage_factory, tmp_path)
    probe = storage_factory.open(cache_size_mb=1)
    limit = probe.shared.cache.index_limit
    probe.close()
    change(storage_factory, {i: -i for i in range(10)}, new=limit + 10)
    with caplog.at_level(logging.INFO, logger="zodbsql"):
        second = loaded(open_cached(storage_factory, directory, cache_size_mb=1,
                                    prefetch_count=0))
    cache_file = second.shared.persistent
    assert cache_file is not None and cache_file.found > COUNT
    assert cache_file.adopted == 0
    said = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert said == [f"zodbsql: state cache file {cache_file.path} not used: more than"
                    f" {limit} objects changed since it was saved"]
    assert read_all(second)[0] == {i: (-i if i < 10 else i) for i in range(COUNT)}


def test_a_deletion_while_down_is_not_served_from_the_file(storage_factory, tmp_path):
    """An object deleted (``deleteObject``, as zc.zodbdgc does) and two changed while
    the process was down: none of the three is adopted, the deleted one can't be
    loaded, the others are; the read-back counted three changes."""
    directory = filled_and_saved(storage_factory, tmp_path)
    db = ZODB.DB(storage_factory.open())
    conn = db.open()
    oids = {i: conn.root()[i]._p_oid for i in (4, 5, 6)}
    conn.close()
    db.close()
    change(storage_factory, {5: "five", 6: "six"})
    writer = storage_factory.open()
    txn = TransactionMetaData()
    writer.tpc_begin(txn)
    writer.deleteObject(oids[4], writer.load(oids[4])[1], txn)
    writer.tpc_vote(txn)
    writer.tpc_finish(txn)
    writer.close()
    second = loaded(open_cached(storage_factory, directory, prefetch_count=0))
    cache_file = second.shared.persistent
    assert cache_file is not None
    assert cache_file.changes == 3
    assert cache_file.adopted == cache_file.found - 3
    cache = second.shared.cache
    assert not any(cache.has(u64(oid), cache.polled) for oid in oids.values())
    instance = second.new_instance()
    instance.poll_invalidations()
    with pytest.raises(POSKeyError):
        instance.load(oids[4])
    db = ZODB.DB(second)
    conn = db.open()
    assert [conn.root()[i]["value"] for i in (3, 5, 6, 7)] == [3, "five", "six", 7]
    conn.close()
    instance.release()
    db.close()


def overtaken_once(conn: Any, meanwhile: Any, times: int = 1) -> Any:
    """``conn`` (a connection of the read-back) whose first ``times`` rollbacks, each
    right after its poll, let another process commit and the storage poll first: the
    read-back's poll is then older than the index the storage started, as when a
    request's first poll comes between the two."""
    rollback = conn.rollback
    left = [times]

    def then_meanwhile() -> None:
        rollback()
        if left[0] > 0:
            left[0] -= 1
            meanwhile()
    conn.rollback = then_meanwhile
    return conn


def test_a_check_overtaken_by_the_first_poll_polls_again(storage_factory, tmp_path):
    directory = filled_and_saved(storage_factory, tmp_path)
    change(storage_factory, {3: "changed before the check"})
    storage = storage_factory.open()                # no file of its own: not started
    instance = storage.new_instance()

    def meanwhile() -> None:
        change(storage_factory, {7: "changed during the check"})
        instance.poll_invalidations()               # the storage's first poll
    cache = storage.shared.cache
    assert cache.polled < 0
    checker = opened_beside(storage, directory,
                            connect=lambda: overtaken_once(storage.shared.connect(), meanwhile))
    adopted = checker.load()
    assert adopted == checker.found - 2 > COUNT - 2
    assert checker.changes == 2                     # polled again: both changes
    db = ZODB.DB(storage)
    conn = db.open()
    assert conn.root()[3]["value"] == "changed before the check"
    assert conn.root()[7]["value"] == "changed during the check"
    conn.close()
    instance.release()
    db.close()


def test_a_read_back_that_fails_is_logged_and_the_storage_goes_on(storage_factory,
                                                                   tmp_path, caplog):
    """The thread's read-back raised (here its connection could not be opened): a
    warning with the traceback, ``loaded`` is set all the same, and nothing adopted."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = loaded(open_cached(storage_factory, directory))

    def refused() -> Any:
        raise OSError("connection refused by the test")
    broken = opened_beside(storage, directory, connect=refused)
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        broken.start()
        assert broken.loaded.wait(60)
        broken.close(save=False)
    (record,) = caplog.records
    assert record.getMessage() == f"zodbsql: could not read back the state cache {broken.path}"
    assert record.exc_info is not None and "connection refused" in str(record.exc_info[1])
    assert broken.adopted == 0
    assert read_all(storage)[0] == {i: i for i in range(COUNT)}
    storage.close()


def test_the_thread_saves_every_interval_and_close_saves_once_more(storage_factory,
                                                                   tmp_path, caplog):
    """With an interval, the file is written while the storage runs; ``close()``
    (its default) saves again; a save that fails is logged, by the thread and by
    close, and the thread goes on."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = loaded(open_cached(storage_factory, directory))
    db = reading(storage)
    elsewhere = tmp_path / "a" / "b" / "cache"        # its parents do not exist yet
    saver = opened_beside(storage, elsewhere, interval=0.05)
    assert saver.save() > COUNT
    (elsewhere / saver.identity.file_name).unlink()
    saver.start()
    assert saver._thread is not None and saver._thread.daemon
    assert saver._thread.name == f"zodbsql cache file {saver.identity.file_name}"
    assert saver.loaded.wait(60)
    for _ in range(400):
        if (elsewhere / saver.identity.file_name).exists():
            break
        threading.Event().wait(0.05)
    assert (elsewhere / saver.identity.file_name).exists()      # saved by the thread
    saver.close()
    assert saver._thread is not None and not saver._thread.is_alive()
    (elsewhere / saver.identity.file_name).unlink()
    saver.close()                                   # no thread any more: saves alone
    assert (elsewhere / saver.identity.file_name).exists()
    # A directory that can't be made (a file is in its place): the saves fail.
    blocked = tmp_path / "blocked"
    blocked.write_bytes(b"a file, not a directory")
    failing = opened_beside(storage, blocked, interval=0.05)
    with caplog.at_level(logging.WARNING, logger="zodbsql"):
        failing.start()
        assert failing.loaded.wait(60)
        for _ in range(400):
            if len(caplog.records) >= 2:
                break
            threading.Event().wait(0.05)
        failing.close()
    messages = {r.getMessage() for r in caplog.records}
    expected = f"zodbsql: could not save the state cache to {failing.path}"
    assert messages == {expected, f"zodbsql: ignoring the state cache file {failing.path}:"
                        f" [Errno 20] Not a directory: '{failing.path}'"}
    saves = [r for r in caplog.records if r.getMessage() == expected]
    assert len(saves) >= 2 and all(isinstance(r.exc_info, tuple) for r in saves)
    db.close()


def test_a_save_says_what_it_wrote(storage_factory, tmp_path, caplog):
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = loaded(open_cached(storage_factory, directory))
    db = reading(storage)
    saver = opened_beside(storage, tmp_path / "other")
    with caplog.at_level(logging.DEBUG, logger="zodbsql.cache.persistent"):
        written = saver.save()
    (record,) = [r for r in caplog.records if r.name == "zodbsql.cache.persistent"]
    found = re.fullmatch(rf"zodbsql: saved {written} states to {re.escape(str(saver.path))}"
                         r" in (\d+\.\d\d) s", record.getMessage())
    assert found is not None and float(found.group(1)) < 60
    db.close()


def test_a_cache_that_never_polled_saves_nothing(tmp_path):
    never = PersistentCache(str(tmp_path / "cache"), cachefile.Identity("d", True, None),
                            StateCache(1 << 20), None, lambda: None, 3600.0)  # type: ignore[arg-type]
    assert never.save() == 0
    assert not (tmp_path / "cache").exists()
    assert (never.found, never.adopted, never.changes) == (0, 0, 0)


class Clock:
    """``time`` for the breather: a clock the test moves, and the sleeps asked for."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_breather_sleeps_idle_times_the_work_and_pauses_while_requests_run(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(persistent, "time", clock)
    requests = [5]
    breathe = Breather(lambda: requests[0])
    assert breathe.seen == 5                        # counted from here on
    clock.now += 0.002                              # a batch's work, no request
    breathe()
    assert clock.slept == [pytest.approx(persistent.IDLE * 0.002)]
    requests[0] = 8                                 # requests ran meanwhile
    clock.now += 0.001
    breathe()
    assert clock.slept[-1] == persistent.BUSY_PAUSE
    assert breathe.seen == 8
    clock.now += 0.001                              # none since
    breathe()
    assert clock.slept[-1] == pytest.approx(persistent.IDLE * 0.001)
    requests[0] = 4
    clock.now += 0.01                               # a long batch: its own pause is longer
    breathe()
    assert clock.slept[-1] == pytest.approx(persistent.IDLE * 0.01)
    quiet = Breather()                              # no activity to watch
    assert (quiet.activity, quiet.seen) == (None, 0)
    clock.now += 0.004
    quiet()
    assert clock.slept[-1] == pytest.approx(persistent.IDLE * 0.004)


def test_the_breather_of_a_file_watches_the_cache_s_requests(storage_factory, tmp_path):
    """The read-back's breather counts the state cache's hits and misses."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = loaded(open_cached(storage_factory, directory))
    cache_file = storage.shared.persistent
    assert cache_file is not None
    breathe = cache_file._breather()
    cache = storage.shared.cache
    assert breathe.activity is not None
    assert breathe.activity() == cache.hits + cache.misses
    cache.clear()
    db = reading(storage)                           # misses, then hits
    assert cache.misses > 0 and cache.hits > 0
    assert breathe.activity() == cache.hits + cache.misses > breathe.seen
    db.close()


def test_the_file_is_read_with_the_breather(storage_factory, tmp_path, monkeypatch):
    """The read of the file pauses as the adoption does (a long file is read in the
    background while requests are served)."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = storage_factory.open()
    given: list[Any] = []
    real_read = cachefile.read

    def read(path: pathlib.Path, identity: Any, breathe: Any = None) -> Any:
        given.append(breathe)
        return real_read(path, identity, breathe)
    monkeypatch.setattr(cachefile, "read", read)
    checker = opened_beside(storage, directory)
    assert checker.load() == checker.found > COUNT
    assert len(given) == 1 and isinstance(given[0], Breather)
    storage.close()


def test_close_without_a_thread_saves(storage_factory, tmp_path):
    """A file object never started (its thread never ran) saves at ``close()``."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = loaded(open_cached(storage_factory, directory))
    db = reading(storage)
    saver = opened_beside(storage, tmp_path / "never-started")
    saver.close()
    assert saver.path.exists()
    assert len(cachefile.read(saver.path, saver.identity)[0].entries) > COUNT
    db.close()



def test_a_check_overtaken_three_times_gives_up(storage_factory, tmp_path, caplog):
    """Overtaken at each of its three polls (here the cache starts afresh each time,
    as after a reset, and a request polls first): the file is not used, and the log
    says why; overtaken twice, the third poll succeeds."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = storage_factory.open()
    instance = storage.new_instance()
    cache = storage.shared.cache
    changes = iter(range(100))

    def meanwhile() -> None:
        change(storage_factory, {7: f"change {next(changes)}"})
        cache.clear()
        instance.poll_invalidations()
    for times, adopted in ((3, False), (2, True)):
        cache.clear()
        checker = opened_beside(storage, directory, connect=lambda: overtaken_once(
            storage.shared.connect(), meanwhile, times))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="zodbsql"):
            assert (checker.load() > COUNT - 2) is adopted
        said = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
        assert said == ([] if adopted else [
            f"zodbsql: state cache file {checker.path} not used: new polls overtook the"
            " check three times"])
    instance.release()
    storage.close()


def test_a_cache_that_polled_before_the_file_was_saved_checks_from_its_poll(
        storage_factory, tmp_path):
    """This process polled, then another changed objects and saved the file at a later
    tid: the read-back polls from this process's poll (not the file's tid, which would
    leave a gap in the index) and adopts the file's states."""
    directory = tmp_path / "cache"
    ZODB.DB(storage_factory.open()).close()         # the database and its root
    storage = storage_factory.open()
    instance = storage.new_instance()
    instance.poll_invalidations()                   # this process's first poll
    first = storage.shared.cache.polled
    saver = loaded(open_cached(storage_factory, directory))
    db = ZODB.DB(saver)
    with db.transaction() as conn:
        for i in range(COUNT):
            conn.root()[i] = PersistentMapping(value=i)
    conn = db.open()
    conn.cacheMinimize()
    assert [conn.root()[i]["value"] for i in range(COUNT)] == list(range(COUNT))
    conn.close()
    db.close()                                      # saved, at the fill's tid
    _, segments = cachefile.decode(the_file(directory).read_bytes())
    assert min(segment.as_of for segment in segments) > first
    checker = opened_beside(storage, directory)
    assert checker.load() == checker.found > COUNT
    assert checker.changes == COUNT + 1             # the fill, polled from ``first``
    instance.release()
    storage.close()


def test_an_index_too_full_for_the_check_leaves_the_file_unused(storage_factory, tmp_path,
                                                                caplog):
    """The process's own polls filled most of its index (objects another process
    added), and the read-back's poll, within its limit, would overfill it: the file is
    not used, and the log says so."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = storage_factory.open(cache_size_mb=1)
    limit = storage.shared.cache.index_limit
    instance = storage.new_instance()
    instance.poll_invalidations()
    change(storage_factory, {}, new=limit // 2 + 10)
    instance.poll_invalidations()                   # indexed: more than half the limit
    checker = opened_beside(storage, directory)
    with caplog.at_level(logging.INFO, logger="zodbsql"):
        assert checker.load() == 0
    assert checker.changes == limit // 2 + 12       # and the root, and "many"
    assert [r.getMessage() for r in caplog.records] == [
        f"zodbsql: state cache file {checker.path} not used: {checker.changes} objects"
        " changed since it was saved, more than the cache's index holds beside its own"]
    instance.release()
    storage.close()


def test_deletions_that_can_no_longer_be_listed_leave_the_file_unused(
        storage_factory, tmp_path, caplog):
    """Three packs since the save (each collecting garbage; each prunes the deletion
    records made before the one before it began) pruned records made after it: a
    process that read the pack marker before them would check the file against polls
    that can't name every deletion; it does not use the file."""
    directory = filled_and_saved(storage_factory, tmp_path)
    storage = storage_factory.open()
    for round_ in range(3):
        db = ZODB.DB(storage_factory.open())
        with db.transaction() as conn:
            conn.root()[round_] = PersistentMapping(value="replaced")   # garbage
        db.storage.pack(time.time() + 1, referencesf)
        db.close()
    checker = opened_beside(storage, directory)     # the file's own (older) marker
    with caplog.at_level(logging.INFO, logger="zodbsql"):
        assert checker.load() == 0
    assert [r.getMessage() for r in caplog.records] == [
        f"zodbsql: state cache file {checker.path} not used: objects deleted since it"
        " was saved can no longer be listed"]
    storage.close()
