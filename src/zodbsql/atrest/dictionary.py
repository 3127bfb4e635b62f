"""A zstd dictionary trained on a database's own records (``zodbsql train-dict``).

Small states compress poorly alone: most of their bytes are class names and pickle
opcodes that every state of a class repeats.  A dictionary holds those once.
"""
from __future__ import annotations

from zodbsql.atrest.codec import zstandard_module
from zodbsql.backends.base.contract import BackendContract, CodecRole
from zodbsql.errors import ConfigurationError

# Portable SQL (no modulo: SQLite has it only when built with its math functions).
OID_RANGE = "SELECT MIN(zoid), MAX(zoid) FROM object_state WHERE state IS NOT NULL"
STATE_FROM = ("SELECT zoid, tid, state FROM object_state WHERE state IS NOT NULL"
              " AND zoid >= %s ORDER BY zoid, tid LIMIT 1")


def sample_states(backend: BackendContract, codec: CodecRole, count: int) -> list[bytes]:
    """Up to ``count`` states, one at each of ``count`` oids spread evenly over the
    oids in use, as they are before sealing."""
    conn = backend.connect()
    try:
        low, high = conn.fetchone(OID_RANGE) or (None, None)
        if low is None or high is None:
            return []
        low, high = int(low), int(high)
        found: dict[int, tuple[int, bytes]] = {}
        for step in range(count):
            row = conn.fetchone(STATE_FROM, (low + (high - low) * step // max(count, 1),))
            if row is not None:
                found[int(row[0])] = (int(row[1]), bytes(row[2]))
    finally:
        conn.close()
    return [codec.decode(oid, tid, state) for oid, (tid, state) in sorted(found.items())]


def train(samples: list[bytes], size: int) -> bytes:
    """A zstd dictionary of at most ``size`` bytes from ``samples``."""
    if len(samples) < 10:
        raise ConfigurationError(
            f"train-dict needs at least 10 stored states to learn from, found {len(samples)}")
    zstd = zstandard_module()
    try:
        return bytes(zstd.train_dictionary(size, samples).as_bytes())
    except zstd.ZstdError as exc:
        raise ConfigurationError(f"zstd could not train a dictionary: {exc}") from None
