"""What a state's references are, as recorded at commit (pack and prefetch follow them)."""
from __future__ import annotations

import io
import pickle

import pytest
from persistent import Persistent
from persistent.mapping import PersistentMapping
import ZODB
from ZODB.MappingStorage import MappingStorage
from ZODB.utils import u64

from zodbsql.storage.records import references


class Leaf(Persistent):
    """An object whose class pickle holds neither reference opcode's byte."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def pickled(obj: Persistent) -> tuple[bytes, list[int]]:
    """``obj``'s record as ZODB writes it, committed to a MappingStorage with what it
    refers to, and the oids of the objects of ``obj.children`` (when it has them)."""
    db = ZODB.DB(MappingStorage())
    try:
        with db.transaction() as conn:
            conn.root()["obj"] = obj
        with db.transaction() as conn:
            stored = conn.root()["obj"]
            state, _ = db.storage.load(stored._p_oid)
            kids = (stored.get("children", ()) if isinstance(stored, PersistentMapping)
                    else getattr(stored, "children", ()))
            children = [u64(each._p_oid) for each in kids]
        return state, children
    finally:
        db.close()


@pytest.fixture
def unpickled(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The states ZODB's unpickler is given by ``references`` from now on."""
    from zodbsql.storage import records
    real = records._referenced_oids   # what ``references`` calls to unpickle
    given: list[bytes] = []

    def counted(data: bytes) -> set[int]:
        given.append(data)
        return real(data)
    monkeypatch.setattr(records, "_referenced_oids", counted)
    return given


def record_with(*persistent_ids: object) -> bytes:
    """A record (class pickle, state pickle) whose state holds ``persistent_ids`` as
    persistent references, in any form a pickler may have written them."""
    class Referring(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return obj.pid if isinstance(obj, Marker) else None

    class Marker:
        def __init__(self, pid: object) -> None:
            self.pid = pid

    out = io.BytesIO()
    pickler = Referring(out, 3)
    pickler.dump((PersistentMapping, None))
    pickler.dump({"data": [Marker(pid) for pid in persistent_ids]})
    return out.getvalue()


def test_each_form_of_reference_is_read_as_zodb_reads_it() -> None:
    # (oid, class) and the bare oid count; a list (a weak or cross-database reference)
    # does not; an oid pickled as text is read as its ASCII bytes.
    one, two, three = (n.to_bytes(8, "big") for n in (1, 2, 3))
    state = record_with((one, PersistentMapping), two, ["w", (three,)])
    assert references(1, state) == {1, 2}
    assert references(1, record_with(one, "\x00" * 7 + "\x09")) == {1, 9}
    assert references(1, record_with(["m", ("other", three, None)])) == set()


def test_an_oid_not_eight_bytes_long_gives_no_reference(
        caplog: pytest.LogCaptureFixture) -> None:
    # Seven and nine bytes make sixteen: never read as two oids of eight.
    state = record_with(b"\x01" * 7, b"\x02" * 9)
    with caplog.at_level("WARNING", logger="zodbsql.storage.records"):
        assert references(5, state) == set()
    assert "could not read the references of oid 0x0000000000000005" in caplog.text


class Holder(Persistent):
    """A container whose class pickle holds neither opcode's byte either."""

    def __init__(self, children: list[Leaf]) -> None:
        self.children = children


@pytest.mark.parametrize("make", [
    lambda children: PersistentMapping(children=children),
    lambda children: Holder(children),
], ids=["mapping", "holder"])
def test_every_reference_is_found(make) -> None:
    state, children = pickled(make([Leaf(b"") for _ in range(3)]))
    assert len(children) == 3 and references(1, state) == set(children)


def test_a_state_with_a_binary_reference_and_no_text_one_is_read() -> None:
    # Holder's record holds no "P": only the BINPERSID opcode marks its references,
    # and that byte alone must send the state to the unpickler.
    state, children = pickled(Holder([Leaf(b"")]))
    assert pickle.PERSID not in state and pickle.BINPERSID in state
    assert references(1, state) == set(children)


def test_states_without_references() -> None:
    plain, _ = pickled(Leaf(b"no references here"))
    assert pickle.PERSID not in plain and pickle.BINPERSID not in plain
    assert references(1, plain) == set()
    # The opcodes' bytes in data are not references: the unpickler says so.
    data, _ = pickled(Leaf(b"PQ" * 10))
    assert pickle.PERSID in data and pickle.BINPERSID in data
    assert references(1, data) == set()
    assert references(1, None) == set() and references(1, b"") == set()


def test_the_class_name_is_not_taken_for_a_reference(unpickled: list[bytes]) -> None:
    # "PersistentMapping" holds PERSID's byte, "P": the record's class, pickled as
    # GLOBAL's text, is looked past, and a mapping without references is not unpickled.
    state, _ = pickled(PersistentMapping(v=5, s="x" * 100))
    assert pickle.PERSID in state and b"PersistentMapping" in state
    assert references(1, state) == set() and unpickled == []
    # With a child, its reference comes after the class: found.
    with_child, children = pickled(PersistentMapping(children=[Leaf(b"")]))
    assert references(1, with_child) == set(children) and unpickled == [with_child]


def test_a_binary_record_without_the_reference_byte_refers_to_nothing() -> None:
    from zodbsql.storage.records import refers_to_nothing
    leaf, _ = pickled(Leaf(b"no references here"))
    assert leaf[0] == 0x80 and refers_to_nothing(leaf)
    assert refers_to_nothing(b"") and refers_to_nothing(None)
    with_child, _ = pickled(PersistentMapping(children=[Leaf(b"")]))
    assert not refers_to_nothing(with_child)
    # The byte in data only says "maybe": the unpickler decides (no reference here).
    quoted, _ = pickled(Leaf(b"Q"))
    assert not refers_to_nothing(quoted) and references(1, quoted) == set()


def test_a_protocol_1_record_is_always_read() -> None:
    # Python 2's ZODB pickled with protocol 1: no PROTO opcode, references may be
    # PERSID's text as well as BINPERSID; such a record is never taken for a leaf.
    from zodbsql.storage.records import refers_to_nothing
    leaf = pickle.dumps(("cls", None), 1) + pickle.dumps({"a": 1}, 1)
    assert leaf[:1] != b"\x80" and not refers_to_nothing(leaf)
    assert references(1, leaf) == set()
    binary = (pickle.dumps(("cls", None), 1)
              + b"U\x08\x00\x00\x00\x00\x00\x00\x00\x09Q.")
    assert not refers_to_nothing(binary)
    assert references(1, binary) == {9}
    # A reference in PERSID's text alone (protocol 0), in a record without a NUL byte
    # or BINPERSID's: found by its own opcode's byte.
    oid = b"\x01" * 8
    text = b"(U\x03clsNt." + b"P" + oid + b"\n."
    assert b"\x00" not in text and pickle.BINPERSID not in text
    assert references(1, text) == {int.from_bytes(oid, "big")}


class QuietHolder(Persistent):
    """A class whose name holds BINPERSID's byte, "Q": its records are never taken for
    leaves by the byte alone."""

    def __init__(self, children: list[Leaf], data: str = "") -> None:
        self.children = children
        self.data = data


def test_the_reference_byte_in_the_class_name_is_looked_past(unpickled: list[bytes]) -> None:
    leaf, _ = pickled(QuietHolder([], "x" * 100))
    assert pickle.BINPERSID in leaf and b"QuietHolder" in leaf
    assert leaf.count(pickle.BINPERSID) == 1        # only in the class name
    assert references(1, leaf) == set() and unpickled == []
    holder, children = pickled(QuietHolder([Leaf(b""), Leaf(b"")]))
    assert len(children) == 2 and references(1, holder) == set(children)
    assert unpickled == [holder]


def test_an_unreadable_record_is_logged_with_its_oid(caplog: pytest.LogCaptureFixture) -> None:
    # BINPERSID's byte after the class, and no pickle ZODB can read past it.
    broken = b"\x80\x03cmodule\nname\nq\x00.\x80\x03Q\xff\xff"
    with caplog.at_level("WARNING", logger="zodbsql.storage.records"):
        assert references(0x1234, broken) == set()
    assert [record.getMessage().split(":")[0] for record in caplog.records] == [
        "could not read the references of oid 0x0000000000001234"]
    reason = caplog.records[0].getMessage().split(": ", 1)[1]
    assert reason and reason != "None"          # what the unpickler said


def checksum_of(state: bytes, key: bytes | None = None) -> int:
    """``records.checksum`` of a state that is not None: an int, never None."""
    from zodbsql.storage.records import checksum
    value = checksum(state, key)
    assert value is not None
    return value


@pytest.mark.parametrize("key", [None, b"k" * 32])
def test_matcher_answers_as_matches(key: bytes | None) -> None:
    # As verified checks a record: its checksum with the key, or (a record written
    # before the key was set) without one; anything else is refused.
    from zodbsql.storage.records import matcher, matches
    state = b"\x80\x03some state"
    match = matcher(key)
    for stored in (checksum_of(state, key), checksum_of(state), checksum_of(b"other", key),
                   checksum_of(b"other"), 0):
        assert match(state, stored) == matches(state, stored, key)
    assert match(state, checksum_of(state, key)) and match(state, checksum_of(state))
    assert not match(state, checksum_of(b"other", key)) and not match(state, 0)


class PlainQuiet(Persistent):
    """A class whose name holds both opcodes' bytes, "P" and "Q"."""

    def __init__(self, data: str = "") -> None:
        self.data = data


class HolderQ(Persistent):
    """A class whose name ends with BINPERSID's byte, just before GLOBAL's newline."""

    def __init__(self, data: str = "") -> None:
        self.data = data


def test_the_unpickler_reads_only_what_may_hold_a_reference(unpickled: list[bytes]) -> None:
    """The pre-filter looks for the opcodes' bytes after the record's class only, from
    the first byte after GLOBAL's text, and not at all without BINPERSID's byte; none of
    these records refers to anything, and none reaches the unpickler."""
    text_only, _ = pickled(Leaf(b"PPP"))              # PERSID's byte, no BINPERSID's
    both_in_name, _ = pickled(PlainQuiet("x" * 50))
    last_of_name, _ = pickled(HolderQ("x" * 50))
    assert pickle.PERSID in text_only and pickle.BINPERSID not in text_only
    assert both_in_name.count(pickle.PERSID) == 1 and both_in_name.count(pickle.BINPERSID) == 1
    assert last_of_name.count(pickle.BINPERSID) == 1 and b"HolderQ\n" in last_of_name
    for state in (text_only, both_in_name, last_of_name):
        assert references(1, state) == set()
    assert unpickled == []


def test_a_reference_before_newlines_in_a_record_without_a_class_global() -> None:
    # A binary record that does not open with GLOBAL (no class text to look past): its
    # references are searched from the start, whatever newlines its data holds after.
    class Refs(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return obj if isinstance(obj, bytes) and len(obj) == 8 else None
    import io
    out = io.BytesIO()
    Refs(out, 3).dump(((b"\x00" * 7 + b"\x07"), "a\nb\nc\n"))
    state = pickle.dumps("metadata", 3) + out.getvalue()    # the class, then the state
    assert state[:1] == b"\x80" and state[2:3] != b"c"
    assert pickle.BINPERSID in state and state.count(b"\n") == 3
    assert state.index(pickle.BINPERSID) < state.index(b"\n")
    assert references(1, state) == {7}


def test_a_state_that_does_not_match_its_checksum_is_refused_by_name() -> None:
    from zodbsql.errors import CorruptRecordError
    from zodbsql.storage.records import checksum, verified
    state = b"\x80\x03a state"
    assert verified(5, 7, checksum(state), state) == state
    assert verified(5, 7, None, state) == state          # written without a checksum
    with pytest.raises(CorruptRecordError) as raised:
        verified(5, 7, (checksum(state) or 0) ^ 1, state)
    assert str(raised.value) == (
        "corrupt record for oid 0x0000000000000005 tid 0x0000000000000007:"
        " the state does not match its checksum")


def test_zodbs_own_records_are_read_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record as ZODB writes it (every oid eight bytes, as (oid, class) or alone, and
    weak references beside them) is read without ``referencesf``, whose Python step per
    reference is what made a 1,000-child container cost 0.73 ms; that serves only the
    other forms (an oid pickled as text)."""
    from ZODB.serialize import referencesf as real   # what records falls back on
    from zodbsql.storage import records
    called: list[bytes] = []

    def slower(data: bytes) -> list[bytes]:
        called.append(data)
        return real(data)
    monkeypatch.setattr(records, "referencesf", slower)
    state, children = pickled(PersistentMapping(children=[Leaf(b"") for _ in range(3)]))
    assert references(1, state) == set(children) and called == []
    one, two, three = (n.to_bytes(8, "big") for n in (1, 2, 3))
    mixed = record_with((one, PersistentMapping), two, ["w", (three,)])
    assert references(1, mixed) == {1, 2} and called == []
    text = record_with("\x00" * 7 + "\x09")
    assert references(1, text) == {9} and called == [text]
