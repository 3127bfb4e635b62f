"""Opening and closing the caches beside the state cache: its file, its Redis level.

Both need the database's identity (``identity.database_id``); a read-only storage on a
database that has none yet runs without them, with a warning.  The Redis level is set
up first, at open (the checkpoint read from the database, and one poll that extends the
cache's index back to it); the file is read back afterwards, in the background.
"""
from __future__ import annotations

import logging

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.cache.cachefile import Identity
from zodbsql.cache.persistent import PersistentCache
from zodbsql.cache.secondlevel import RedisCache
from zodbsql.errors import described
from zodbsql.storage import identity
from zodbsql.storage.history import PACKED_TID
from zodbsql.storage.shared import Shared

log = logging.getLogger(__name__)


def open_caches(shared: Shared, conn: ConnectionRole) -> None:
    """Set up the Redis level and start reading back the file, as the options say."""
    options = shared.options
    wanted = [key for key, value in (("cache-redis-url", options.cache_redis_url),
                                     ("cache-persistent-dir", options.cache_persistent_dir))
              if value]
    if not wanted or not shared.cache.enabled:
        return
    backend = shared.backend
    database = identity.database_id(backend, conn, options.read_only)
    if database is None:
        log.warning("zodbsql: %s has no database_id yet and the storage is read-only:"
                    " %s not used", backend.describe(), " and ".join(wanted))
        return
    if options.cache_redis_url:
        shared.second_level = open_redis(shared, conn, database, options.cache_redis_url)
    if options.cache_persistent_dir:
        packed = backend.history.get_meta(conn, PACKED_TID)
        conn.rollback()
        shared.persistent = PersistentCache(
            options.cache_persistent_dir, Identity(database, options.keep_history, packed),
            shared.cache, backend, shared.connect, options.cache_persistent_interval)
        shared.persistent.start()


def open_redis(shared: Shared, conn: ConnectionRole, database: str, url: str) -> RedisCache:
    options, cache, backend = shared.options, shared.cache, shared.backend
    poller = backend.poller
    record = None if options.read_only else (lambda tid: record_checkpoint(shared, tid))
    level = RedisCache(url, options.cache_redis_prefix, database, options.keep_history, cache,
                       record)
    newest = poller.last_tid(conn)
    checkpoint = identity.cache_checkpoint(backend, conn, newest, options.read_only)
    if checkpoint is None or checkpoint > newest:
        checkpoint = newest     # read-only without one, or one this server never reached
    polled = poller.poll(conn, checkpoint, limit=cache.index_limit)
    conn.rollback()
    upto = polled.upto
    if cache.cover(checkpoint, upto, polled.changes, polled.gone, polled.gone_seq,
                   polled.lists_everything):
        level.checkpoint = checkpoint
    elif cache.cover(upto, upto, []):
        level.publish_checkpoint(upto)      # too much changed since the shared one
    return level


def record_checkpoint(shared: Shared, tid: int) -> None:
    """Record the Redis level's new checkpoint in the database (``publish_checkpoint``'s
    thread): on a connection of its own; a failure is logged, and processes that open
    meanwhile take the older one (their keys then meet at it)."""
    backend = shared.backend
    try:
        conn = backend.connect_for_commit(shared.options.commit_lock_timeout)
        try:
            identity.advance_cache_checkpoint(backend, conn, tid)
        finally:
            conn.close()
    except Exception as exc:    # a thread of its own: logged, never raised
        log.warning("zodbsql: could not record the Redis cache's checkpoint in %s: %s",
                    backend.describe(), described(exc))


def close_caches(shared: Shared, save: bool = True) -> None:
    """Save and close the file (unless ``save`` is False), close the Redis level."""
    if shared.persistent is not None:
        shared.persistent.close(save)
        shared.persistent = None
    if shared.second_level is not None:
        shared.second_level.close()
        shared.second_level = None
