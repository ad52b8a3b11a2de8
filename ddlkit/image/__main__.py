"""``python -m ddlkit.image build [--tag TAG] [--base IMAGE]`` (also ``ddlkit image build``)."""

from __future__ import annotations

import argparse
import sys

from ddlkit.errors import DdlkitError


def add_parsers(sub) -> None:
    p = sub.add_parser("build", help="build the kit's image with buildah (idempotent, cached)")
    p.add_argument("--tag", default=None, help="default: localhost/ddlkit:0.1.0")
    p.add_argument("--base", default=None, help="an image to build on (default: a Debian base)")


def run_parsed(args: argparse.Namespace) -> int:
    from ddlkit.image import build

    build.build(args.tag or build.DEFAULT_TAG, args.base)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddlkit.image", description=__doc__)
    add_parsers(parser.add_subparsers(dest="image_command", required=True))
    args = parser.parse_args(argv)
    try:
        return run_parsed(args)
    except DdlkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
