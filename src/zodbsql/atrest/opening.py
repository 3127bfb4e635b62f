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

#: Meta entries ``key_check:<id>``: an AES-GCM tag made with that key the first time it
#: was used, so a different key under the same id is refused at open.
KEY_CHECK = "key_check:"
#: The key id the database's first encrypted records used: once set, a storage without
#: keys may open it read-only only (it would write records in clear among them).
ENCRYPTED_WITH = "encrypted_with"
#: Meta entries ``checksum_key:<id>``: the database's checksum key (random, made with its
#: first encrypted records), encrypted with the key of that id.  Record checksums stay
#: in clear; keyed, they can't confirm a guessed state.  Every key id a storage opens
#: the database with gets an entry, so the key survives rotation.
CHECKSUM_KEY = "checksum_key:"


def codec_for(options: Options) -> RecordCodec:
    """The record codec of ``options`` (``PLAIN`` with both features off)."""
    keys = load_keys(options.key_file, options.key_env, options.key_id)
    # compress-dict: the dictionary new records use, then any that older records
    # were compressed with (comma-separated), kept readable.
    dictionaries: list[bytes] = []
    for path in (options.compress_dict or "").split(","):
        path = path.strip()
        if not path:
            continue
        try:
            with open(path, "rb") as stream:
                dictionaries.append(stream.read())
        except OSError as exc:
            raise ConfigurationError(
                f"compress-dict {path!r} cannot be read: {exc.strerror}") from None
    dictionary = dictionaries[0] if dictionaries else None
    if keys is not None:
        _need_cryptography()
    if options.compress == "off" and keys is None and dictionary is None:
        return PLAIN
    return RecordCodec(compress=options.compress == "zstd", level=options.compress_level,
                       threshold=options.compress_threshold, dictionary=dictionary,
                       keys=keys, older_dictionaries=dictionaries[1:])


def check_keys(backend: BackendContract, conn: ConnectionRole, keys: KeyRing,
               read_only: bool) -> bytes | None:
    """Refuse a key whose id the database knows with another key; record the ones it
    does not know yet (unless read-only).  Return the database's checksum key (None:
    read-only on a database without encrypted records).

    Everything is checked before anything is recorded: a refused open leaves the meta
    table as it was, so a key id it named is not bound to a key that never wrote.
    What is recorded is recorded in one transaction, which first records the key id of
    the first encrypted records unless another has: processes that encrypt a new
    database at once queue there, and each takes the checksum key of the first, or is
    refused, whatever ids they were given."""
    history = backend.history
    unchecked = [key_id for key_id in keys.ids()
                 if not _passes_check(backend, keys, key_id,
                                      history.get_meta(conn, KEY_CHECK + key_id))]
    found, missing = _open_checksum_key(backend, conn, keys)
    if read_only or (found is not None and not (missing or unchecked)
                     and history.get_meta(conn, ENCRYPTED_WITH) is not None):
        return found
    conn.begin_write()
    try:
        # Nothing is read in the transaction before this insert, which waits for a
        # racing one: what that process recorded is seen after it (MySQL's snapshot
        # begins at the transaction's first read).
        history.add_meta(conn, ENCRYPTED_WITH, keys.current)
        found, missing = _checksum_entries(backend, conn, keys)
        if found is None:
            first = history.get_meta(conn, ENCRYPTED_WITH)
            assert first is not None    # recorded by this transaction or the one it waited for
            if first != keys.current:
                raise _no_key_opens(backend, keys, first)
            found = os.urandom(32)  # the first encrypted records: a new checksum key
        for key_id in missing:
            # (A racing process that records it too wraps the same checksum key.)
            history.add_meta(conn, CHECKSUM_KEY + key_id, _wrap(keys, key_id, found))
        for key_id in unchecked:
            # Another process may have recorded another key under the id meanwhile.
            history.add_meta(conn, KEY_CHECK + key_id, _key_check(keys, key_id))
            _passes_check(backend, keys, key_id, history.get_meta(conn, KEY_CHECK + key_id))
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return found


def _key_check(keys: KeyRing, key_id: str) -> str:
    """A new check value of ``key_id``'s key: an AES-GCM tag of nothing."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    key = keys.get(key_id)
    assert key is not None
    nonce = os.urandom(12)
    return base64.b64encode(nonce + AESGCM(key).encrypt(nonce, b"", _aad(key_id))).decode()


def _passes_check(backend: BackendContract, keys: KeyRing, key_id: str,
                  recorded: str | None) -> bool:
    """Does the check recorded for ``key_id`` open with its configured key?  False when
    none is recorded; RecordKeyError when it does not open."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    if recorded is None:
        return False
    key = keys.get(key_id)
    assert key is not None
    raw = base64.b64decode(recorded)
    try:
        AESGCM(key).decrypt(raw[:12], raw[12:], _aad(key_id))
    except InvalidTag:
        raise RecordKeyError(
            f"the key configured as key id {key_id!r} is not the key {backend.describe()}"
            " was written with under that id; nothing was written", key_id) from None
    return True


def _open_checksum_key(backend: BackendContract, conn: ConnectionRole,
                       keys: KeyRing) -> tuple[bytes | None, list[str]]:
    """The database's checksum key opened with a configured key (None: it has none
    yet), and the configured ids it is not recorded under.  Reads only."""
    found, missing = _checksum_entries(backend, conn, keys)
    if found is None:
        first = backend.history.get_meta(conn, ENCRYPTED_WITH)
        if first is not None:
            raise _no_key_opens(backend, keys, first)
    return found, missing


def _checksum_entries(backend: BackendContract, conn: ConnectionRole,
                      keys: KeyRing) -> tuple[bytes | None, list[str]]:
    """The checksum key as the configured ids' entries open it (None: no entry), and
    the ids that have none."""
    found = None
    missing = []
    for key_id in keys.ids():
        wrapped = backend.history.get_meta(conn, CHECKSUM_KEY + key_id)
        if wrapped is None:
            missing.append(key_id)
        else:
            found = _unwrap(keys, key_id, wrapped)
    return found, missing


def _no_key_opens(backend: BackendContract, keys: KeyRing, first: str) -> RecordKeyError:
    return RecordKeyError(
        f"none of the configured key ids ({', '.join(keys.ids())}) has opened"
        f" {backend.describe()} before, so its checksum key can't be read; configure"
        f" a key id it knows (the first was {first!r}) beside the new one once;"
        " nothing was written", first)


def _wrap(keys: KeyRing, key_id: str, secret: bytes) -> str:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    key = keys.get(key_id)
    assert key is not None
    nonce = os.urandom(12)
    return base64.b64encode(nonce + AESGCM(key).encrypt(nonce, secret, _wrap_aad(key_id))
                            ).decode()


def _unwrap(keys: KeyRing, key_id: str, wrapped: str) -> bytes:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    key = keys.get(key_id)
    assert key is not None
    raw = base64.b64decode(wrapped)
    try:
        return AESGCM(key).decrypt(raw[:12], raw[12:], _wrap_aad(key_id))
    except InvalidTag:
        raise RecordKeyError(
            f"the key configured as key id {key_id!r} does not open the checksum key"
            " recorded under that id; nothing was written", key_id) from None


def _wrap_aad(key_id: str) -> bytes:
    return b"zodbsql checksum key " + key_id.encode("ascii")


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
