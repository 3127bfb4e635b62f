"""``zodbsql TOOL ...``: dispatch to the tool modules and turn our errors into one line."""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

from zodbsql.errors import ZodbsqlError

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
        print(f"zodbsql {args.tool}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"zodbsql {args.tool}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
