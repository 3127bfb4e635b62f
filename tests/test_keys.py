"""Encryption keys as the operator writes them (atrest/keys.py): every accepted form
read to the exact bytes, every refusal in its whole words, none quoting key material."""
from __future__ import annotations

import base64
import pathlib

import pytest

from zodbsql.atrest.keys import DEFAULT_KEY_ID, KeyRing, load_keys, parse_keys
from zodbsql.errors import ConfigurationError

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 124))
KEY_C = bytes(range(200, 216))


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def refusal(call: object, *args: object) -> str:
    """The message of the ConfigurationError ``call(*args)`` raises."""
    assert callable(call)
    with pytest.raises(ConfigurationError) as info:
        call(*args)
    return str(info.value)


def write(tmp_path: pathlib.Path, text: str | bytes) -> str:
    path = tmp_path / "keys"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def test_each_size_aes_takes_is_read_to_its_bytes() -> None:
    for key in (KEY_A, KEY_B, KEY_C):
        assert parse_keys(b64(key), "src", "bare") == {"bare": key}


@pytest.mark.parametrize("size", [15, 17, 23, 25, 31, 33, 0])
def test_other_sizes_are_refused_with_the_size(size: int) -> None:
    key = bytes(size)
    assert refusal(parse_keys, f"k:{b64(key)}", "src", "bare") == (
        f"src: the key with id 'k' is {size} bytes; AES needs 16, 24 or 32")


def test_ids_comments_commas_and_lines() -> None:
    text = (f"# written by the operator\n  a:{b64(KEY_A)}  \n\n"
            f"   # indented comment:{b64(KEY_C)}\nb:{b64(KEY_B)}, c : {b64(KEY_C)} ,\n")
    assert parse_keys(text, "src", "bare") == {"a": KEY_A, "b": KEY_B, "c": KEY_C}


def test_nothing_but_comments_holds_no_key() -> None:
    assert refusal(parse_keys, "# none yet\n , \n", "key-file '/k'", "bare") == (
        "key-file '/k' holds no key")


def test_several_bare_keys_need_ids() -> None:
    assert refusal(parse_keys, f"{b64(KEY_A)}\n{b64(KEY_B)}", "src", "bare") == (
        "src, entry 1: several keys need an id each (id:base64key)")
    # The entry's number counts from one, over entries, not lines.
    assert refusal(parse_keys, f"# c\na:{b64(KEY_A)}\n\nb:{b64(KEY_B)},{b64(KEY_C)}",
                   "src", "bare") == (
        "src, entry 3: several keys need an id each (id:base64key)")
    assert refusal(parse_keys, f"a:{b64(KEY_A)},b:{b64(KEY_B)},{b64(KEY_C)}",
                   "src", "bare") == (
        "src, entry 3: several keys need an id each (id:base64key)")


@pytest.mark.parametrize("key_id", ["", "with space", "x" * 65, "a/b", "é"])
def test_bad_ids_are_refused(key_id: str) -> None:
    assert refusal(parse_keys, f"a:{b64(KEY_A)}\n{key_id}:{b64(KEY_B)}", "src", "bare") == (
        "src, entry 2: a key id is 1 to 64 letters, digits, '.', '_' or '-'")


def test_the_id_ends_at_the_first_colon() -> None:
    # A colon can't be in base64 or in an id: "a:b:KEY" is id "a" and a bad key, not id
    # "a:b".
    assert refusal(parse_keys, f"a:b:{b64(KEY_A)}", "src", "bare") == (
        "src: the key with id 'a' is not valid base64")
    assert parse_keys(f"{'x' * 64}:{b64(KEY_A)}", "src", "bare") == {"x" * 64: KEY_A}


def test_a_stray_character_in_a_key_is_refused_not_dropped() -> None:
    encoded = b64(KEY_A)
    # b64decode without validation skips the '*' and reads the very key: a typo would
    # go unseen until another process, with the file fixed, read different bytes.
    for typo in (encoded[:10] + "*" + encoded[10:], encoded[:10] + " " + encoded[10:]):
        assert refusal(parse_keys, f"k:{typo}", "src", "bare") == (
            "src: the key with id 'k' is not valid base64")


def test_an_id_given_twice_is_refused() -> None:
    assert refusal(parse_keys, f"k:{b64(KEY_A)}\nk:{b64(KEY_A)}", "src", "bare") == (
        "src: key id 'k' appears twice")


def test_refusals_never_quote_the_text() -> None:
    secret = b64(KEY_A)
    for text in (f"k:{secret}*", f"k:{b64(KEY_A[:20])}", f"{secret}\n{secret}",
                 f"bad id:{secret}", f"k:{secret}\nk:{secret}"):
        message = refusal(parse_keys, text, "src", "bare")
        assert secret[:12] not in message and b64(KEY_A[:20])[:12] not in message


def test_a_key_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, f"{b64(KEY_B)}\n")
    ring = load_keys(path, None, None)
    assert ring is not None
    assert (ring.ids(), ring.current, ring.get(DEFAULT_KEY_ID)) == (
        [DEFAULT_KEY_ID], DEFAULT_KEY_ID, KEY_B)
    named = load_keys(path, None, "2026")
    assert named is not None and (named.ids(), named.current, named.get("2026")) == (
        ["2026"], "2026", KEY_B)


def test_a_key_file_that_cannot_be_read(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "none")
    assert refusal(load_keys, missing, None, None) == (
        f"key-file {missing!r} cannot be read: No such file or directory")
    assert refusal(load_keys, str(tmp_path), None, None) == (
        f"key-file {str(tmp_path)!r} cannot be read: Is a directory")
    # Keys are ASCII, whatever the locale's encoding: a key pasted with a smart quote,
    # or a file saved with a byte-order mark, is refused where it goes wrong.
    path = write(tmp_path, f"k:{b64(KEY_A)}\u2019\n".encode())
    assert refusal(load_keys, path, None, None) == (
        f"key-file {path!r} is not ASCII text (a byte above 127 at offset 46); keys are"
        " base64, one id:key entry a line")
    path = write(tmp_path, b"\xef\xbb\xbf" + f"k:{b64(KEY_A)}\n".encode())
    assert refusal(load_keys, path, None, None) == (
        f"key-file {path!r} is not ASCII text (a byte above 127 at offset 0); keys are"
        " base64, one id:key entry a line")


def test_errors_name_the_key_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "# empty\n")
    assert refusal(load_keys, path, None, None) == f"key-file {path!r} holds no key"


def test_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZODBSQL_TEST_KEY", b64(KEY_C))
    ring = load_keys(None, "ZODBSQL_TEST_KEY", "env")
    assert ring is not None and (ring.ids(), ring.current, ring.get("env")) == (
        ["env"], "env", KEY_C)
    monkeypatch.setenv("ZODBSQL_TEST_KEY", "")
    assert refusal(load_keys, None, "ZODBSQL_TEST_KEY", None) == (
        "environment variable 'ZODBSQL_TEST_KEY' holds no key")
    monkeypatch.delenv("ZODBSQL_TEST_KEY")
    assert refusal(load_keys, None, "ZODBSQL_TEST_KEY", None) == (
        "key-env names the environment variable 'ZODBSQL_TEST_KEY', which is not set")


def test_file_and_variable_together(tmp_path: pathlib.Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, f"a:{b64(KEY_A)}\nb:{b64(KEY_B)}")
    # The same key under the same id in both is fine; a new id adds its key.
    monkeypatch.setenv("ZODBSQL_TEST_KEY", f"b:{b64(KEY_B)},c:{b64(KEY_C)}")
    ring = load_keys(path, "ZODBSQL_TEST_KEY", "c")
    assert ring is not None
    assert [(key_id, ring.get(key_id)) for key_id in ring.ids()] == [
        ("a", KEY_A), ("b", KEY_B), ("c", KEY_C)]
    assert ring.current == "c"
    # A bare key in the variable takes key-id's id, as in the file.
    monkeypatch.setenv("ZODBSQL_TEST_KEY", b64(KEY_C))
    ring = load_keys(path, "ZODBSQL_TEST_KEY", "new")
    assert ring is not None and ring.get("new") == KEY_C and ring.current == "new"
    monkeypatch.setenv("ZODBSQL_TEST_KEY", f"b:{b64(KEY_C)}")
    message = refusal(load_keys, path, "ZODBSQL_TEST_KEY", "b")
    assert message == "key id 'b' has different keys in key-file and key-env"
    monkeypatch.setenv("ZODBSQL_TEST_KEY", "b:???")
    assert refusal(load_keys, path, "ZODBSQL_TEST_KEY", "b") == (
        "environment variable 'ZODBSQL_TEST_KEY': the key with id 'b' is not valid base64")


def test_which_key_new_records_use(tmp_path: pathlib.Path) -> None:
    one = load_keys(write(tmp_path, f"only:{b64(KEY_A)}"), None, None)
    assert one is not None and one.current == "only"
    several = write(tmp_path, f"b:{b64(KEY_B)}\na:{b64(KEY_A)}")
    assert refusal(load_keys, several, None, None) == (
        "several keys are configured (a, b): key-id must say which one new records use")
    assert refusal(load_keys, several, None, "c") == (
        "key-id 'c' names no configured key (ids found: a, b)")


def test_no_source() -> None:
    assert load_keys(None, None, None) is None
    assert refusal(load_keys, None, None, "k") == (
        "key-id is set but neither key-file nor key-env is")


def test_the_ring_shows_ids_only() -> None:
    ring = KeyRing({"b": KEY_B, "a": KEY_A}, "b")
    assert repr(ring) == "<KeyRing ids=['a', 'b'] current='b'>"
    assert ring.get("c") is None
    with pytest.raises(ConfigurationError) as info:
        KeyRing({"b": KEY_B, "a": KEY_A}, "z")
    assert str(info.value) == "key-id 'z' names no configured key (ids found: a, b)"
