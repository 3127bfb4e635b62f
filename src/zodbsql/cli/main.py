"""``zodbsql TOOL ...``: dispatch to the tool modules and turn errors into one line.

Every error message is printed without passwords.  Errors that are not zodbsql's own
are printed as one line too, with their type; ``ZODBSQL_TRACEBACK=1`` shows the
traceback as well.  The tools need the ``cli`` extra (rich, matplotlib), which the
storage does not: without it ``zodbsql`` says so in one line.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import Callable, Sequence

from zodbsql.errors import ZodbsqlError
from zodbsql.masking import mask_secrets

#: The tools, each a module ``zodbsql.cli.NAME`` with `add_arguments(parser)`,
#: `run(args) -> int`, a `HELP` line and an `EXAMPLE`.
TOOLS = ("bench", "demo", "convert", "pack", "verify", "report", "doctor", "blobspeed",
         "rekey", "train-dict")
#: The packages of the ``cli`` extra.
CLI_EXTRA = ("rich", "matplotlib")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zodbsql", description="Tools for zodbsql, a ZODB storage in SQL databases.")
    sub = parser.add_subparsers(dest="tool", metavar="TOOL", required=True)
    for name in TOOLS:
        module = importlib.import_module(f"zodbsql.cli.{name.replace('-', '_')}")
        tool = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                              epilog=module.EXAMPLE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(tool)
        tool.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:
        package = (exc.name or "").partition(".")[0]
        if package not in CLI_EXTRA:
            raise
        print(f"zodbsql: the tools need {package}, which the storage alone does not"
              " install: pip install 'zodbsql[cli]'", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except ZodbsqlError as exc:
        print(f"zodbsql {args.tool}: error: {mask_secrets(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"zodbsql {args.tool}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if os.environ.get("ZODBSQL_TRACEBACK"):
            print(mask_secrets(traceback.format_exc()), file=sys.stderr, end="")
        print(f"zodbsql {args.tool}: error: {type(exc).__name__}:"
              f" {mask_secrets(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
