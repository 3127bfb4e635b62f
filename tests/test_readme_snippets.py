"""Every configuration snippet and Python example in README.md works as written.

ZConfig snippets (a zope.conf block, a ``<zodbsql>`` section, a bench ``--config`` file)
are parsed with ZODB's schema, as Zope and the tools read them; zodburi lines are
resolved; Python blocks run, with their paths moved into a temporary directory.
"""
from __future__ import annotations

import io
import pathlib
import re
import shlex
import textwrap

import pytest
import transaction
import ZConfig
import ZODB.config

from zodbsql.cli import zopeconf
from zodbsql.config import StorageFactory
from zodbsql.uri import resolve_uri

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
#: The dated measurements that were the README's bench notes: their commands and links
#: are checked as the README's are.
MEASUREMENTS = README.parent / "docs" / "measurements.md"
#: A fenced block, also indented (inside a list item).
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)\n(?P<body>.*?)^(?P=indent)```$",
                   re.MULTILINE | re.DOTALL)


def blocks(kind: str) -> list[tuple[int, str]]:
    """(line number, text) of the README's code blocks of one kind."""
    text = README.read_text()
    found = []
    for match in FENCE.finditer(text):
        body, lang = textwrap.dedent(match.group("body")), match.group("lang")
        line = text.count("\n", 0, match.start()) + 1
        starts = body.lstrip()[:1]             # ZConfig: a directive or a section
        is_zconfig = starts in ("%", "<") and ("<zodbsql" in body or "%import" in body)
        if ((kind == "zconfig" and is_zconfig)
                or (kind == "uri" and not is_zconfig and body.startswith("zodbsql+"))
                or (kind == "python" and lang == "python")):
            found.append((line, body))
    return found


def as_database_config(body: str, instance: pathlib.Path) -> str:
    """A snippet as a whole file ZODB's database schema reads."""
    if zopeconf.is_zope_config(body):
        body = zopeconf.as_database_config(body)
    elif not re.search(r"<zodb[\s>]", body):
        body = f"<zodb>\n{body}</zodb>\n"        # a bare <zodbsql> section
    if "%import zodbsql" not in body:
        body = "%import zodbsql\n" + body
    return f"%define INSTANCE {instance}\n" + body


@pytest.mark.parametrize("line, body", blocks("zconfig"), ids=lambda v: str(v)[:12])
def test_zconfig_snippet_parses(line: int, body: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "var").mkdir()          # $INSTANCE/var, as in a Zope instance
    if "<zodbsql destination>" in body:
        # RelStorage's zodbconvert reads it, with its own schema (importing RelStorage).
        from relstorage.zodbconvert import schema_xml  # type: ignore[import-untyped]
        schema = ZConfig.loadSchemaFile(io.StringIO(schema_xml))
        config, _ = ZConfig.loadConfigFile(schema, io.StringIO(body))
        assert isinstance(config.destination, StorageFactory), f"README line {line}"
        return
    if "%import relstorage" in body and "zodbsql" not in body:
        config, _ = ZConfig.loadConfigFile(ZODB.config.getDbSchema(), io.StringIO(body))
        assert config.database, f"README line {line}"
        return
    text = as_database_config(body, tmp_path)
    config, _ = ZConfig.loadConfigFile(ZODB.config.getDbSchema(), io.StringIO(text))
    storages = [section.config.storage for section in config.database]
    assert any(isinstance(s, StorageFactory) for s in storages), f"README line {line}"


def test_snippets_are_found() -> None:
    assert len(blocks("zconfig")) >= 3 and blocks("uri") and blocks("python")


@pytest.mark.parametrize("line, body", blocks("uri"), ids=lambda v: str(v)[:12])
def test_zodburi_lines_resolve(line: int, body: str) -> None:
    for uri in body.split():
        factory, dbkw = resolve_uri(uri)
        assert callable(factory), f"README line {line}: {uri}"


@pytest.mark.parametrize("line, body", blocks("python"), ids=lambda v: str(v)[:12])
def test_python_example_runs(line: int, body: str, tmp_path: pathlib.Path) -> None:
    code = body.replace("/var/db/", f"{tmp_path}/")
    try:
        exec(compile(code, f"README.md line {line}", "exec"), {"__name__": "readme"})
    finally:
        transaction.abort()


def shell_commands(path: pathlib.Path = README) -> list[str]:
    """Every ``zodbsql`` command of a document: in ``sh`` blocks (continuation lines
    joined, ``&&`` chains split) and in inline code."""
    text = path.read_text()
    found = [m.group(1) for m in re.finditer(r"`((?:\.venv/bin/)?zodbsql [^`]+)`", text)]
    for match in FENCE.finditer(text):
        if match.group("lang") == "sh":
            for line in match.group("body").replace("\\\n", " ").splitlines():
                found += [part.strip() for part in line.split("&&")
                          if part.strip().startswith(("zodbsql ", ".venv/bin/zodbsql "))]
    return sorted(set(found))


@pytest.mark.parametrize("path", [README, MEASUREMENTS], ids=lambda p: p.name)
def test_every_zodbsql_command_is_one_the_tools_accept(
        path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Parsed by the tools' own argument parser: a renamed option or tool fails here,
    in the measurements' commands too, so that each can still be run again.
    (The quick start's commands also run verbatim in CI: scripts/readme_quickstart.)"""
    from zodbsql.cli.main import TOOLS, build_parser
    parser = build_parser()
    commands = shell_commands(path)
    assert len(commands) >= 10
    for command in commands:
        argv = shlex.split(command)[1:]
        if argv[0].startswith("TOOL") or argv in ([tool] for tool in TOOLS):
            continue     # a placeholder, or a tool named in a sentence
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: {command!r}: {capsys.readouterr().err.strip()}")


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped (not
    ``-`` or ``_``), spaces to ``-``."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """The anchors of a document's headings; a repeated one also as GitHub numbers it."""
    text = FENCE.sub("", path.read_text())      # a "#" line in a code block is no heading
    found: dict[str, int] = {}
    for line in text.splitlines():
        if match := re.match(r"#{1,6} (.+)$", line):
            anchor = _anchor(match.group(1))
            count = found.get(anchor, 0)
            found[anchor] = count + 1
            if count:
                found[f"{anchor}-{count}"] = 1
    return set(found)


def links(path: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    """A document's relative links outside code blocks, as (file, anchor): ``#a`` is
    the document itself, ``../README.md#a`` another one; the anchor is "" for none."""
    text = FENCE.sub("", path.read_text())
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue                            # https:, mailto:
        file, _, anchor = target.partition("#")
        found.append(((path.parent / file).resolve() if file else path, anchor))
    return found


@pytest.mark.parametrize("path", [README, MEASUREMENTS], ids=lambda p: p.name)
def test_every_link_within_the_readme_reaches_a_heading(path: pathlib.Path) -> None:
    """Also between the README and the measurements moved out of it (``#a``,
    ``docs/measurements.md#a``, ``../README.md#a``): a heading renamed in one breaks
    the other's links."""
    found = links(path)
    other = MEASUREMENTS if path == README else README
    assert any(file == other and anchor for file, anchor in found)  # the check reaches across
    missing = sorted(f"{file.name}#{anchor}" if anchor else str(file)
                     for file, anchor in set(found)
                     if not file.exists() or anchor and anchor not in anchors(file))
    assert not missing, f"{path.name}: links to no heading or file: {missing}"
