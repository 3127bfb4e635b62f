"""Passwords out of text: what zodbsql prints, logs or writes passes through here.

Masks the password of a URL (``postgresql://user:pw@host/db``, ``zodbsql+mysql://...``),
of a libpq key=value DSN (``password=pw``, quoted or not), of a URL query
(``?password=pw``) and of a Python mapping's repr (``'passwd': 'pw'``);
:func:`mask_config` also masks ZConfig key lines (``passwd pw``).  Where a secret's end
is ambiguous the mask takes more rather than less.
"""
from __future__ import annotations

import re

MASK = "***"

_KEY = r"(?:ssl)?pass(?:word|wd)"    # password, passwd, sslpassword
# scheme://user:password@host: the password runs to the last "@" of the token, so an
# unencoded "@" or "/" in it is masked too.
_URL = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)\S*(?=@)")
# ...?password=pw&...: up to the next parameter.
_QUERY = re.compile(rf"(?P<head>[?&]{_KEY}=)[^&#\s]*", re.I)
# password=pw or password = 'p w' (libpq), not a URL query parameter.
_PAIR = re.compile(rf"(?P<head>(?<![?&\w]){_KEY}\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|\S+)", re.I)
# 'passwd': 'pw' in the repr of a dict.
_ITEM = re.compile(
    rf"""(?P<head>['"]{_KEY}['"]\s*:\s*)(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^,}}\s]+)""",
    re.I)
# A ZConfig key line: passwd pw
_LINE = re.compile(rf"^(?P<head>[ \t]*{_KEY}[ \t]+)\S.*$", re.I | re.M)


def _masked(text: str, patterns: tuple[re.Pattern[str], ...]) -> str:
    for pattern in patterns:
        text = pattern.sub(lambda m: m.group("head") + MASK, text)
    return text


def mask_secrets(text: str) -> str:
    """``text`` (a message, a URL, a DSN) with every password replaced by ``***``."""
    return _masked(text, (_URL, _QUERY, _PAIR, _ITEM))


def mask_config(text: str) -> str:
    """ZConfig text with every password replaced by ``***``: also ``passwd`` lines
    (kept out of :func:`mask_secrets`, where a message line may start with the word)."""
    return _masked(text, (_URL, _QUERY, _PAIR, _ITEM, _LINE))
