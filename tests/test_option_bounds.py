"""Each bounded setting of the storage: the value at its edge accepted, the one just
past it refused with words that name the setting, the bound and the value given (what
an operator reads when zope.conf or a URL says something impossible), and the URL
query's values read as the setting's type or refused by name."""
from __future__ import annotations

from typing import Any

import pytest

from zodbsql.backends.mysql.options import MySQLOptions
from zodbsql.backends.sqlite.options import SQLiteOptions
from zodbsql.errors import ConfigurationError
from zodbsql.options import Options, convert, from_query

# (keyword arguments at the edge, accepted; the same just past it; the whole message)
EDGES: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    ({"cache_size_mb": 0}, {"cache_size_mb": -1}, "cache-size-mb must be 0 or more, got -1"),
    ({"heap_trim_interval": 0}, {"heap_trim_interval": -0.5},
     "heap-trim-interval must be 0 or more seconds, got -0.5 (0 turns it off)"),
    ({"cache_persistent_interval": 0.001}, {"cache_persistent_interval": 0},
     "cache-persistent-interval must be a positive number of seconds, got 0"),
    ({"prefetch_count": 0}, {"prefetch_count": -1},
     "prefetch-count must be 0 or more, got -1 (0 turns it off)"),
    ({"prefetch_bytes": 0}, {"prefetch_bytes": -1},
     "prefetch-bytes must be 0 or more, got -1 (0 turns it off)"),
    ({"poll_changes_limit": 0}, {"poll_changes_limit": -1},
     "poll-changes-limit must be 0 or more, got -1 (0 turns it off)"),
    ({"commit_lock_timeout": 0.001}, {"commit_lock_timeout": 0},
     "commit-lock-timeout must be a positive number of seconds, got 0"),
    ({"row_lock_timeout": 0.001}, {"row_lock_timeout": 0},
     "row-lock-timeout must be a positive number of seconds, got 0"),
    ({"slow_statement": 0}, {"slow_statement": -0.1},
     "slow-statement must be 0 or more seconds, got -0.1"),
    ({"pack_batch_size": 1}, {"pack_batch_size": 0}, "pack-batch-size must be at least 1, got 0"),
    ({"pack_duty_cycle": 1}, {"pack_duty_cycle": 1.01},
     "pack-duty-cycle must be in (0, 1], got 1.01"),
    ({"pack_duty_cycle": 0.01}, {"pack_duty_cycle": 0},
     "pack-duty-cycle must be in (0, 1], got 0"),
    ({"cache_compress": "auto"}, {"cache_compress": "lz4"},
     "cache-compress must be off, zstd or auto, got 'lz4'"),
    ({"compress": "zstd"}, {"compress": "auto"}, "compress must be off or zstd, got 'auto'"),
    ({"compress_level": 1}, {"compress_level": 0}, "compress-level must be 1 to 22, got 0"),
    ({"compress_level": 22}, {"compress_level": 23}, "compress-level must be 1 to 22, got 23"),
    ({"compress_threshold": 0}, {"compress_threshold": -1},
     "compress-threshold must be 0 or more bytes, got -1"),
    ({"shared_blob_dir": True, "blob_dir": "/srv/blobs"}, {"shared_blob_dir": True},
     "shared-blob-dir is true but no blob-dir is set"),
    ({"blob_cache_size": 0}, {"blob_cache_size": -1},
     "blob-cache-size must be 0 or more bytes, got -1"),
    ({"blob_chunk_size": 1024}, {"blob_chunk_size": 1023},
     "blob-chunk-size must be at least 1024 bytes, got 1023"),
    ({"key_file": "/etc/zodbsql.key", "cache_persistent_dir": None},
     {"key_file": "/etc/zodbsql.key", "cache_persistent_dir": "/var/cache/zodbsql"},
     "cache-persistent-dir would keep states unencrypted; it can't be used with key-file"
     " or key-env"),
    ({"key_env": "ZODBSQL_KEY"}, {"key_env": "ZODBSQL_KEY", "cache_redis_url": "redis://r"},
     "cache-redis-url would keep states unencrypted; it can't be used with key-file or"
     " key-env"),
]


@pytest.mark.parametrize("accepted, refused, message", EDGES,
                         ids=[" ".join(refused) for _, refused, _ in EDGES])
def test_a_setting_at_its_edge_is_taken_and_past_it_refused_in_words(
        accepted: dict[str, Any], refused: dict[str, Any], message: str) -> None:
    options = Options(**accepted)
    for name, value in accepted.items():
        assert getattr(options, name) == value
    with pytest.raises(ConfigurationError) as info:
        Options(**refused)
    assert str(info.value) == message
    with pytest.raises(ConfigurationError):   # a changed copy is checked too
        Options().replace(**refused)


def test_the_caches_that_keep_states_elsewhere_are_allowed_unencrypted() -> None:
    options = Options(cache_persistent_dir="/var/cache/zodbsql", cache_redis_url="redis://r")
    assert not options.encrypted
    assert Options(key_file="/etc/zodbsql.key").encrypted
    assert Options(key_env="ZODBSQL_KEY").encrypted


def test_the_row_lock_wait_is_its_own_setting_or_the_commit_lock_timeout() -> None:
    assert Options(commit_lock_timeout=12).row_lock_wait == 12
    assert Options(commit_lock_timeout=12, row_lock_timeout=3).row_lock_wait == 3


def test_a_copy_changes_only_what_it_names() -> None:
    options = Options(commit_lock_timeout=12, prefetch_count=7)
    changed = options.replace(prefetch_count=0)
    assert (changed.prefetch_count, changed.commit_lock_timeout) == (0, 12)
    assert options.prefetch_count == 7


@pytest.mark.parametrize("text, value", [
    ("true", True), ("Yes", True), ("ON", True), ("1", True),
    ("false", False), ("no", False), ("Off", False), ("0", False)])
def test_a_url_boolean_is_read_in_any_of_its_spellings(text: str, value: bool) -> None:
    assert convert(Options, "keep_history", text) is value


def test_url_values_are_read_as_their_settings_types() -> None:
    assert from_query(Options, {"prefetch_count": "12", "commit_lock_timeout": "2.5",
                                "row_lock_timeout": "1.5", "compress": "zstd"}) == {
        "prefetch_count": 12, "commit_lock_timeout": 2.5, "row_lock_timeout": 1.5,
        "compress": "zstd"}
    assert type(from_query(Options, {"commit_lock_timeout": "3"})["commit_lock_timeout"]) is float


@pytest.mark.parametrize("name, text, message", [
    ("keep_history", "maybe", "keep_history must be true or false, got 'maybe'"),
    ("prefetch_count", "1.5", "prefetch_count must be a int, got '1.5'"),
    ("commit_lock_timeout", "soon", "commit_lock_timeout must be a float, got 'soon'"),
])
def test_a_url_value_of_the_wrong_type_is_refused_by_name(name: str, text: str,
                                                         message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        convert(Options, name, text)
    assert str(info.value) == message


@pytest.mark.parametrize("name, values", [
    ("cache_compress", ("off", "zstd", "auto")), ("compress", ("off", "zstd"))])
def test_each_named_value_of_a_setting_is_taken(name: str, values: tuple[str, ...]) -> None:
    for value in values:
        given: dict[str, Any] = {name: value}
        assert getattr(Options(**given), name) == value


@pytest.mark.parametrize("read_only", [None, False, True])
def test_a_backend_is_made_with_the_storage_settings_it_is_given(
        tmp_path: Any, read_only: bool | None) -> None:
    path = tmp_path / "Data.sqlite"
    path.touch()                   # a read-only backend is made for a file that exists
    options = SQLiteOptions(path=str(path))
    if read_only is None:          # not given: a writable backend
        backend = options.create_backend(False, 7.5)
    else:
        backend = options.create_backend(True, 7.5, read_only)
    assert (backend.keep_history, backend.lock_timeout, backend.read_only) == (
        read_only is not None, 7.5, bool(read_only))
    assert backend.options is options


def test_no_secret_setting_is_shown_by_repr() -> None:
    """What logs and tracebacks print of the settings: the plain ones, never a password
    or a URL that may hold one."""
    shown = repr(Options(prefetch_count=7, cache_redis_url="redis://:s3cret@cache:6379/0"))
    assert "prefetch_count=7" in shown and "s3cret" not in shown
    mysql = repr(MySQLOptions(db="site", user="alice", passwd="s3cret",
                              replica_dsns="mysql://alice:s3cret2@standby/site"))
    assert "user='alice'" in mysql and "db='site'" in mysql
    assert "s3cret" not in mysql
