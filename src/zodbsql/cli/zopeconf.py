"""Read the databases of a Zope instance's configuration (zope.conf, zodb.conf).

A Zope configuration follows Zope's schema, not ZODB's: keys such as ``instancehome``
and sections such as ``<environment>`` are unknown to ``ZODB.config``, and databases are
``<zodb_db NAME>`` sections whose own keys (``mount-point``, ``cache-size``) the tools
do not need.  The tools keep what they need, as text ZODB's schema reads: every ZConfig
directive (``%define``, ``%import``, ``%include``) and, of each ``<zodb_db NAME>``, the
storage section inside it, as ``<zodb NAME>``.  Every other line becomes an empty one,
so ZConfig's messages give the line numbers of the file itself.
"""
from __future__ import annotations

import re

#: A section's opening line: ``<type name>`` (not a closing ``</type>``).
OPENING = re.compile(r"^\s*<\s*(?P<type>[A-Za-z_][\w.-]*)(?:\s+(?P<name>[^>]*?))?\s*(?P<empty>/)?>")
CLOSING = re.compile(r"^\s*</\s*(?P<type>[\w.-]+)\s*>")


def is_zope_config(text: str) -> bool:
    """Does the configuration hold Zope's ``<zodb_db>`` sections?"""
    return any(_opening_type(line) == "zodb_db" for line in text.splitlines())


def _opening_type(line: str) -> str | None:
    match = OPENING.match(line)
    return match.group("type").lower() if match else None


def database_names(text: str) -> list[str]:
    """The names of the ``<zodb_db>`` sections."""
    return [(OPENING.match(line).group("name") or "").strip()  # type: ignore[union-attr]
            for line in text.splitlines() if _opening_type(line) == "zodb_db"]


def as_database_config(text: str, name: str = "") -> str:
    """The directives and the ``<zodb_db>`` sections (only ``name``'s, when given) of a
    Zope configuration, as a configuration ZODB's database schema reads."""
    kept: list[str] = []
    inside: str | None = None        # the name of the <zodb_db> being read
    depth = 0                        # nesting below that <zodb_db>
    for line in text.splitlines():
        stripped = line.strip()
        if inside is None:
            match = OPENING.match(line)
            if stripped.startswith("%"):
                kept.append(line)
            elif match and match.group("type").lower() == "zodb_db" and not match.group("empty"):
                inside, depth = (match.group("name") or "").strip(), 0
                wanted = not name or inside == name
                kept.append((f"<zodb {inside}>" if inside else "<zodb>") if wanted else "")
            else:
                kept.append("")
            continue
        closing = CLOSING.match(line)
        opening = OPENING.match(line)
        if closing and depth == 0:           # </zodb_db>
            kept.append("</zodb>" if wanted else "")
            inside = None
            continue
        if opening and not opening.group("empty"):
            depth += 1
        elif closing:
            depth -= 1
        elif depth == 0 and not opening:
            kept.append("")                  # a key of <zodb_db> itself: Zope's, not ours
            continue
        kept.append(line if wanted else "")
    return "\n".join(kept) + "\n"
