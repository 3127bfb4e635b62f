"""The codec a storage's options describe, and the check of its keys against the
database before anything is written."""
from __future__ import annotations

import base64
import os

from zodbsql.atrest.codec import PLAIN, RecordCodec
from zodbsql.atrest.keys import KeyRing, load_keys
from zodbsql.backends.base.contract import BackendContract, ConnectionRole
from zodbsql.errors import ConfigurationError, RecordKeyError
from zodbsql.options import Options
from zodbsql.storage import identity

#: Meta entries ``key_check:<id>``: an AES-GCM tag made with that key the first time it
#: was used, so a different key under the same id is refused at open.
KEY_CHECK = "key_check:"
#: The key id the database's first encrypted records used: once set, a storage without
#: keys may open it read-only only (it would write records in clear among them).
ENCRYPTED_WITH = "encrypted_with"


def codec_for(options: Options) -> RecordCodec:
    """The record codec of ``options`` (``PLAIN`` with both features off)."""
    keys = load_keys(options.key_file, options.key_env, options.key_id)
    dictionary = None
    if options.compress_dict is not None:
        try:
            with open(options.compress_dict, "rb") as stream:
                dictionary = stream.read()
        except OSError as exc:
            raise ConfigurationError(
                f"compress-dict {options.compress_dict!r} cannot be read: {exc.strerror}"
            ) from None
    if keys is not None:
        _need_cryptography()
    if options.compress == "off" and keys is None and dictionary is None:
        return PLAIN
    return RecordCodec(compress=options.compress == "zstd", level=options.compress_level,
                       threshold=options.compress_threshold, dictionary=dictionary,
                       keys=keys)


def check_keys(backend: BackendContract, conn: ConnectionRole, keys: KeyRing,
               read_only: bool) -> None:
    """Refuse a key whose id the database knows with another key; record the ones it
    does not know yet (unless read-only)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    identity.recorded_once(backend, conn, ENCRYPTED_WITH, keys.current, read_only)
    for key_id in keys.ids():
        key = keys.get(key_id)
        assert key is not None
        cipher = AESGCM(key)
        nonce = os.urandom(12)
        made = base64.b64encode(nonce + cipher.encrypt(nonce, b"", _aad(key_id))).decode()
        recorded = identity.recorded_once(backend, conn, KEY_CHECK + key_id, made, read_only)
        if recorded is None:
            continue
        raw = base64.b64decode(recorded)
        try:
            cipher.decrypt(raw[:12], raw[12:], _aad(key_id))
        except InvalidTag:
            raise RecordKeyError(
                f"the key configured as key id {key_id!r} is not the key {backend.describe()}"
                " was written with under that id; nothing was written", key_id) from None


def check_no_keys(backend: BackendContract, conn: ConnectionRole, read_only: bool) -> None:
    """Refuse to write in clear into a database whose records are encrypted."""
    first = backend.history.get_meta(conn, ENCRYPTED_WITH)
    if first is not None and not read_only:
        raise RecordKeyError(
            f"{backend.describe()} holds records encrypted with key id {first!r} (and"
            " maybe later ids), but no key-file or key-env is configured; nothing was"
            " written (read-only, it opens, and a record says which key id it needs)", first)


def _aad(key_id: str) -> bytes:
    return b"zodbsql key check " + key_id.encode("ascii")


def _need_cryptography() -> None:
    try:
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"key-file and key-env need the cryptography package (pip install"
            f" 'zodbsql[atrest]'): {exc}") from None
