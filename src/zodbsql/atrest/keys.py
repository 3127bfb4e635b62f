"""Encryption keys: read from a file or an environment variable, never from the
configuration itself.

Either source holds one key (base64 of 16, 24 or 32 bytes) or entries ``id:base64key``,
one a line or separated by commas (handier in an environment variable);
a bare key takes the id given by ``key-id`` (``default`` when none is).  New records
use ``key-id`` (or the only key); every other id stays readable, so keys can rotate.
Key material appears in no repr, log line or error message: errors name the id.
"""
from __future__ import annotations

import base64
import binascii
import os
import re

from zodbsql.errors import ConfigurationError

#: A bare key (no id) is known by this id when ``key-id`` does not name it.
DEFAULT_KEY_ID = "default"
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")


class KeyRing:
    """The keys one storage may use, by id, and the id new records are sealed with."""

    def __init__(self, keys: dict[str, bytes], current: str) -> None:
        if current not in keys:
            raise ConfigurationError(
                f"key-id {current!r} names no configured key (ids found: {', '.join(sorted(keys))})")
        self._keys = dict(keys)
        self.current = current

    def __repr__(self) -> str:
        return f"<KeyRing ids={sorted(self._keys)} current={self.current!r}>"

    def ids(self) -> list[str]:
        return sorted(self._keys)

    def get(self, key_id: str) -> bytes | None:
        return self._keys.get(key_id)


def parse_keys(text: str, source: str, bare_id: str) -> dict[str, bytes]:
    """The keys in ``text`` (a file's or a variable's content); ``source`` names it in
    errors, which never quote the text."""
    lines = [entry.strip() for line in text.splitlines() if not line.strip().startswith("#")
             for entry in line.split(",") if entry.strip()]
    if not lines:
        raise ConfigurationError(f"{source} holds no key")
    keys: dict[str, bytes] = {}
    for number, line in enumerate(lines, 1):
        key_id, sep, encoded = line.partition(":")
        if not sep:
            if len(lines) > 1:
                raise ConfigurationError(
                    f"{source}, entry {number}: several keys need an id each (id:base64key)")
            key_id, encoded = bare_id, line
        key_id = key_id.strip()
        if not _KEY_ID.match(key_id):
            raise ConfigurationError(
                f"{source}, entry {number}: a key id is 1 to 64 letters, digits, '.', '_' or"
                " '-'")
        try:
            key = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ConfigurationError(
                f"{source}: the key with id {key_id!r} is not valid base64") from None
        if len(key) not in (16, 24, 32):
            raise ConfigurationError(
                f"{source}: the key with id {key_id!r} is {len(key)} bytes; AES needs 16,"
                " 24 or 32")
        if key_id in keys:
            raise ConfigurationError(f"{source}: key id {key_id!r} appears twice")
        keys[key_id] = key
    return keys


def load_keys(key_file: str | None, key_env: str | None, key_id: str | None) -> KeyRing | None:
    """The key ring the options name, or None when they name no key source."""
    if key_file is None and key_env is None:
        if key_id is not None:
            raise ConfigurationError("key-id is set but neither key-file nor key-env is")
        return None
    bare_id = key_id or DEFAULT_KEY_ID
    keys: dict[str, bytes] = {}
    if key_file is not None:
        try:
            with open(key_file, encoding="ascii") as stream:
                text = stream.read()
        except OSError as exc:
            raise ConfigurationError(
                f"key-file {key_file!r} cannot be read: {exc.strerror or type(exc).__name__}"
            ) from None
        except UnicodeDecodeError as exc:
            # Say where, never what: the bytes around it may be key material.
            raise ConfigurationError(
                f"key-file {key_file!r} is not ASCII text (a byte above 127 at offset"
                f" {exc.start}); keys are base64, one id:key entry a line") from None
        keys.update(parse_keys(text, f"key-file {key_file!r}", bare_id))
    if key_env is not None:
        variable = os.environ.get(key_env)
        if variable is None:
            raise ConfigurationError(f"key-env names the environment variable {key_env!r},"
                                     " which is not set")
        for found_id, key in parse_keys(variable, f"environment variable {key_env!r}",
                                        bare_id).items():
            if keys.get(found_id, key) != key:
                raise ConfigurationError(
                    f"key id {found_id!r} has different keys in key-file and key-env")
            keys[found_id] = key
    if key_id is None and len(keys) > 1:
        raise ConfigurationError(
            f"several keys are configured ({', '.join(sorted(keys))}): key-id must say which"
            " one new records use")
    return KeyRing(keys, key_id or next(iter(keys)))
