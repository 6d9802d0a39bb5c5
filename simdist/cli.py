"""The ``simdist`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .layout import Layout


def _layout(text: str) -> Layout:
    """'tp=2,dp=2,pp=2' -> Layout."""
    sizes: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in ("tp", "cp", "dp", "pp") or not value.isdigit():
            raise argparse.ArgumentTypeError(f"expected e.g. tp=2,dp=2,pp=2; got {part!r}")
        sizes[key] = int(value)
    try:
        return Layout(**sizes)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simdist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo_p = sub.add_parser("demo", help="run one real TP x PP x DP training step and check parity")
    demo_p.add_argument("--layout", type=_layout, default=None, help="e.g. tp=2,dp=2,pp=2")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import demo

        return demo(args.layout)
    return 2  # unreachable: argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
