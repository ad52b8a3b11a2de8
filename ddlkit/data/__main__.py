"""``python -m ddlkit.data prepare [--force] [NAME ...]``, ``status``, ``import cifar10 PATH``."""

from __future__ import annotations

import argparse
import sys

from ddlkit.data.build import prepare
from ddlkit.data.catalog import NAMES
from ddlkit.data.status import status
from ddlkit.errors import DdlkitError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr like every other error."""

    def error(self, message: str):
        self.exit(2, f"error: {message}. Fix: see `{self.prog} --help`.\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ddlkit.data", description=__doc__, allow_abbrev=False)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser(
        "prepare", help="build the offline data cache (idempotent)", allow_abbrev=False
    )
    prep.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)}")
    prep.add_argument(
        "--force", action="store_true", help="rebuild even good entries; move corrupt ones aside"
    )
    st = sub.add_parser(
        "status", help="what load() would use for each data set", allow_abbrev=False
    )
    st.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(NAMES)}")
    imp = sub.add_parser(
        "import",
        help="check a data set's official archive you have and put it where Keras and the kit look",
        allow_abbrev=False,
    )
    imp.add_argument("name", choices=["cifar10"], help="the data set (only cifar10 needs this)")
    imp.add_argument("path", metavar="PATH", help="the official cifar-10-python.tar.gz")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "prepare":
            table = prepare(args.names or None, force=args.force, echo=print)
        elif args.command == "import":
            from ddlkit.data.archive import import_cifar10

            print(f"{args.name}: checking {args.path} (sha256, as tf-keras does) ...", flush=True)
            table = import_cifar10(args.path)
        else:
            table = status(args.names or None)
    except DdlkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
