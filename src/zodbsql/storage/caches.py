"""Opening and closing the caches beside the state cache: its file, its Redis level.

Both need the database's identity (``identity.database_id``); a read-only storage on a
database that has none yet runs without them, with a warning.  The Redis level is set
up first, at open (one Redis read and one poll that extends the cache's index back to
the shared checkpoint); the file is read back afterwards, in the background.
"""
from __future__ import annotations

import logging

from zodbsql.backends.base.contract import ConnectionRole
from zodbsql.cache.cachefile import Identity
from zodbsql.cache.persistent import PersistentCache
from zodbsql.cache.secondlevel import RedisCache
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
    options, cache, poller = shared.options, shared.cache, shared.backend.poller
    level = RedisCache(url, options.cache_redis_prefix, database, options.keep_history, cache)
    newest = poller.last_tid(conn)
    checkpoint = level.read_checkpoint(newest)
    if checkpoint is None or checkpoint > newest:
        checkpoint = newest     # Redis down, or a checkpoint this database never reached
    polled = poller.poll(conn, checkpoint, limit=cache.index_limit)
    conn.rollback()
    upto = polled.upto
    if cache.cover(checkpoint, upto, polled.changes, polled.gone, polled.gone_seq,
                   polled.lists_everything):
        level.checkpoint = checkpoint
    elif cache.cover(upto, upto, []):
        level.publish_checkpoint(upto)      # too much changed since the shared one
    return level


def close_caches(shared: Shared, save: bool = True) -> None:
    """Save and close the file (unless ``save`` is False), close the Redis level."""
    if shared.persistent is not None:
        shared.persistent.close(save)
        shared.persistent = None
    if shared.second_level is not None:
        shared.second_level.close()
        shared.second_level = None
