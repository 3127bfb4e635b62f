"""What the tools share: opening a storage (see ``opening``), pack times, progress bars."""
from __future__ import annotations

import argparse
import contextlib
import datetime
import time
from typing import Any, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn,
                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)
from ZODB.TimeStamp import TimeStamp
from ZODB.utils import p64

from zodbsql.cli.opening import STORAGE_HELP, open_storage
from zodbsql.errors import ConfigurationError
from zodbsql.storage import SQLStorage

console = Console(stderr=True)

__all__ = ["ConfigurationError", "STORAGE_HELP", "open_storage", "require_zodbsql",
           "progress_bar"]


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
