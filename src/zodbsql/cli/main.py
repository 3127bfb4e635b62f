"""``zodbsql TOOL ...``: dispatch to the tool modules and turn errors into one line.

Every error message is printed without passwords.  Errors that are not zodbsql's own
are printed as one line too, with their type; ``ZODBSQL_TRACEBACK=1`` shows the
traceback as well.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Callable, Sequence

from zodbsql.errors import ZodbsqlError
from zodbsql.masking import mask_secrets

# Each tool module has `add_arguments(parser)`, `run(args) -> int` and a `HELP` line.
from zodbsql.cli import bench, blobspeed, convert, demo, doctor, pack, verify

TOOLS = {"bench": bench, "demo": demo, "convert": convert, "pack": pack, "verify": verify,
         "doctor": doctor, "blobspeed": blobspeed}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zodbsql", description="Tools for zodbsql, a ZODB storage in SQL databases.")
    sub = parser.add_subparsers(dest="tool", metavar="TOOL", required=True)
    for name, module in TOOLS.items():
        tool = sub.add_parser(name, help=module.HELP, description=module.__doc__,
                              epilog=module.EXAMPLE,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(tool)
        tool.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
