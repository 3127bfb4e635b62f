"""A zstd dictionary trained on a database's own records (``zodbsql train-dict``).

Small states compress poorly alone: most of their bytes are class names and pickle
opcodes that every state of a class repeats.  A dictionary holds those once.
"""
from __future__ import annotations

from zodbsql.atrest.codec import zstandard_module
from zodbsql.backends.base.contract import BackendContract, CodecRole
from zodbsql.errors import ConfigurationError

#: Every step-th state of the table (at most LIMIT), so the sample spans the oids.
SAMPLE_STATES = (
    "SELECT zoid, tid, state FROM object_state WHERE state IS NOT NULL AND MOD(zoid, %s) = 0"
    " ORDER BY zoid LIMIT %s")
COUNT_STATES = "SELECT COUNT(*) FROM object_state WHERE state IS NOT NULL"


def sample_states(backend: BackendContract, codec: CodecRole, count: int) -> list[bytes]:
    """About ``count`` states, spread over the oids, as they are before sealing."""
    conn = backend.connect()
    try:
        row = conn.fetchone(COUNT_STATES)
        total = int(row[0]) if row else 0
        step = max(1, total // max(count, 1))
        rows = conn.fetchall(SAMPLE_STATES, (step, count))
    finally:
        conn.close()
    return [codec.decode(int(oid), int(tid), bytes(state)) for oid, tid, state in rows]


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
