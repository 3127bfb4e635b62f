"""What the tools share: opening a storage from a URI or a ZConfig file, progress bars."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import time
from typing import Any, Iterator

import ZConfig
import ZODB.config
import zodburi
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn,
                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import p64

from zodbsql.errors import ConfigurationError
from zodbsql.storage import SQLStorage

console = Console(stderr=True)

STORAGE_HELP = ("a zodburi URI (zodbsql+sqlite:///path, file:///Data.fs, zeo://host:port,"
                " ...), or a ZConfig file with <zodb NAME> sections, as FILE or FILE#NAME")


def open_storage(spec: str, read_only: bool = False) -> Any:
    """Open any ZODB storage named by a URI or a ZConfig file (``FILE#NAME`` picks one)."""
    if "://" in spec and not os.path.exists(spec):
        if spec.startswith(("sqlite:", "sqlite3:")):
            spec = "zodbsql+" + spec
        try:
            factory, _ = zodburi.resolve_uri(spec)
        except KeyError as exc:
            raise ConfigurationError(f"no storage knows the URI {spec!r} ({exc})") from None
        return factory()
    path, _, name = spec.partition("#")
    if not os.path.exists(path):
        raise ConfigurationError(f"{path} does not exist (expected {STORAGE_HELP})")
    schema = ZODB.config.getDbSchema()
    try:
        config, _ = ZConfig.loadConfig(schema, path)
    except ZConfig.ConfigurationError as exc:
        raise ConfigurationError(f"{path}: {exc}") from None
    sections = config.database
    if name:
        chosen = [s for s in sections if s.name == name]
        if not chosen:
            names = ", ".join(str(s.name) for s in sections)
            raise ConfigurationError(f"{path} has no <zodb {name}> section (it has: {names})")
    elif len(sections) != 1:
        names = ", ".join(str(s.name) for s in sections)
        raise ConfigurationError(f"{path} has {len(sections)} <zodb> sections ({names});"
                                 " pick one with FILE#NAME")
    else:
        chosen = sections
    return chosen[0].config.storage.open()


__all__ = ["ConfigurationError", "open_storage", "require_zodbsql", "progress_bar"]


def require_zodbsql(storage: Any, what: str) -> SQLStorage:
    if not isinstance(storage, SQLStorage):
        raise ConfigurationError(f"{what} needs a zodbsql storage, got {type(storage).__name__}")
    return storage


def add_pack_time_arguments(parser: argparse.ArgumentParser) -> None:
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--days", type=float, default=0.0,
                      help="keep the history of the last DAYS days (default: 0, pack to now)")
    when.add_argument("--before", metavar="TIME",
                      help="pack to this time: ISO 8601 (2026-11-01T12:00) or a tid in hex")


def pack_time(args: argparse.Namespace) -> float:
    """The pack time in seconds since the epoch, from --days or --before."""
    if args.before:
        text = args.before.strip()
        if len(text) == 16 and all(c in "0123456789abcdefABCDEF" for c in text):
            return TimeStamp(p64(int(text, 16))).timeTime()
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ConfigurationError(
                f"--before {text!r} is neither an ISO time nor a 16-digit hex tid") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        return moment.timestamp()
    return time.time() - args.days * 86400


@contextlib.contextmanager
def progress_bar(quiet: bool = False) -> Iterator[Progress]:
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               MofNCompleteColumn(), TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console, disable=quiet, transient=False) as bar:
        yield bar
