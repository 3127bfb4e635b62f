"""What is computed from a state before it is stored: its checksum and its references."""
from __future__ import annotations

import hashlib
import logging
import pickle
import struct
from io import BufferedReader, BytesIO
from typing import Any, Callable

from zodbpickle.pickle import Unpickler
from ZODB.serialize import referencesf
from ZODB.utils import p64, u64

from zodbsql.errors import CorruptRecordError, described

log = logging.getLogger(__name__)

#: The pickle opcodes of a persistent reference (ZODB pickles with protocol 3).
PERSID = pickle.PERSID
BINPERSID = pickle.BINPERSID
#: The first byte of a pickle of protocol 2 and later.
PROTO = pickle.PROTO[0]
#: BINPERSID's byte as an int: ``int in bytes`` took 0.07-0.09 us with its call here
#: (states up to 2,400 bytes), ``bytes in bytes`` 0.43-0.52 us whatever their length.
BINPERSID_BYTE = BINPERSID[0]


def checksum(state: bytes | None, key: bytes | None = None) -> int | None:
    """A 64-bit BLAKE2b digest as a signed integer (fits every database's BIGINT).

    ``key``: the database's checksum key when records are encrypted (``zodbsql.atrest``),
    so that a checksum, which stays in clear, can't confirm a guessed state.
    """
    if state is None:
        return None
    digest = hashlib.blake2b(state, digest_size=8, key=key or b"").digest()
    return int.from_bytes(digest, "big", signed=True)


def checksummer(key: bytes | None = None) -> Callable[[bytes], int]:
    """``checksum(state, key)`` of a state that is not None, as a function of the state
    alone: a commit takes the checksum of every state it stores, and copying a hasher
    made once (keyed or not) costs two thirds of making one with its arguments."""
    made = hashlib.blake2b(digest_size=8, key=key or b"")
    copy = made.copy
    as_int = int.from_bytes

    def digest(state: bytes) -> int:
        hasher = copy()
        hasher.update(state)
        return as_int(hasher.digest(), "big", signed=True)
    return digest


def verified(oid: int, tid: int, stored_checksum: int | None, state: bytes | None,
             key: bytes | None = None) -> bytes | None:
    """Return ``state`` after checking it against the checksum written with it (with
    ``key``, or without one: a record written before encryption was turned on)."""
    return verified_by(lambda each, stored: matches(each, stored, key),
                       oid, tid, stored_checksum, state)


def verified_by(match: Callable[[bytes, int], bool], oid: int, tid: int,
                stored_checksum: int | None, state: bytes | None) -> bytes | None:
    """``verified`` with ``match`` (a ``matcher``, its hashers made once: a storage's
    ``Shared.matches``) checking the state against its checksum."""
    if state is not None and stored_checksum is not None and not match(
            state, stored_checksum):
        raise CorruptRecordError(oid, tid, "the state does not match its checksum")
    return state


def matches(state: bytes, stored_checksum: int, key: bytes | None) -> bool:
    """Is ``stored_checksum`` the checksum of ``state``, keyed or not?"""
    if checksum(state, key) == stored_checksum:
        return True
    return key is not None and checksum(state) == stored_checksum


def matcher(key: bytes | None) -> Callable[[bytes, int], bool]:
    """``matches`` with ``key`` fixed, for many states: its hashers made once
    (``checksummer``), where ``matches`` makes one or two per state."""
    keyed = checksummer(key)
    unkeyed = checksummer() if key is not None else None

    def match(state: bytes, stored_checksum: int) -> bool:
        return keyed(state) == stored_checksum or (
            unkeyed is not None and unkeyed(state) == stored_checksum)
    return match


def references(oid: int, state: bytes | None) -> set[int]:
    """The oids a state refers to (ZODB's own extraction); empty for a deletion.

    A state ZODB itself can't parse can't reference anything ZODB could load, so it is
    logged and recorded without references rather than refused.
    """
    if state is None or refers_to_nothing(state):
        return set()
    start = 0
    if state[:1] == b"\x80" and state[2:3] == b"c":
        # A ZODB record opens with its class as GLOBAL's text "module\nname\n", whose
        # letters ("PersistentMapping") may be the opcodes' bytes: look past it.
        start = state.find(b"\n", state.find(b"\n", 3) + 1) + 1
    if state.find(PERSID, start) < 0 and state.find(BINPERSID, start) < 0:
        # A reference is pickled with one of these two opcodes: without either byte
        # (most leaf objects) there is nothing to find, and no unpickler to build.
        return set()
    try:
        return _referenced_oids(state)
    except Exception as exc:  # any unpickling error
        log.warning("could not read the references of oid 0x%016x: %s", oid, described(exc))
        return set()


def _referenced_oids(state: bytes) -> set[int]:
    """ZODB's ``referencesf`` as integers: the state of a container of 1,000 children
    took 1.25 ms there, 0.11 here.

    The unpickler reads a file with ``peek`` (a buffered reader) in one prefetch, and
    one without (``BytesIO``, as ZODB gives it) by a call per opcode: 0.58 ms of the
    1.25.  The per-reference steps are done in C where every oid is eight bytes, as
    ZODB writes them: 0.2 ms more.  And it is zodbpickle's unpickler itself, not ZODB's
    subclass (``ZODB._compat.Unpickler``, which only changes how globals are found,
    and ``noload`` finds none): the C unpickler calls a ``persistent_load`` set on an
    instance of a subclass through an attribute lookup each reference (a container of
    1,000 children 0.23 -> 0.11 ms), and the subclass's ``__init__`` is a Python call
    (a leaf state of 1.5 KB that holds the opcode's byte, 3.7 -> 3.0 us)."""
    found: list[Any] = []
    unpickler = Unpickler(BufferedReader(BytesIO(state), len(state) + 1))
    unpickler.persistent_load = found.append
    unpickler.noload()
    unpickler.noload()
    # A reference is (oid, class), the oid alone, or a list (weak, cross-database),
    # which referencesf leaves out.
    oids = [ref[0] if type(ref) is tuple else ref for ref in found if type(ref) is not list]
    if not oids:
        return set()
    if set(map(type, oids)) == {bytes} and set(map(len, oids)) == {8}:
        return set(struct.unpack(f">{len(oids)}Q", b"".join(oids)))
    # Another form (text, a malformed oid): ZODB's own steps, which raise where it would.
    return {u64(ref) for ref in referencesf(state)}


def refers_to_nothing(state: bytes | None) -> bool:
    """A quick answer for most leaf states: True when ``state`` certainly has no
    reference (False: it may have one).

    A binary pickle (protocol 2 and later opens with PROTO, 0x80; ZODB writes both of a
    record's pickles with one pickler) marks every reference with BINPERSID: without
    that byte anywhere, one scan in C, there is none.
    """
    return not state or (state[0] == PROTO and BINPERSID_BYTE not in state)


def references_text(oids: set[int]) -> str | None:
    """``oids`` as the text a revision records them in: a JSON array, ascending (None
    when there are none).  One value per revision, whatever the number of references:
    the backends store it as it is (SQLite, MySQL) or as an array (PostgreSQL)."""
    if not oids:
        return None
    return "[" + ",".join(map(str, sorted(oids))) + "]"


def as_bytes(value: int) -> bytes:
    packed: bytes = p64(value)
    return packed


def as_int(value: bytes) -> int:
    number: int = u64(value)
    return number
