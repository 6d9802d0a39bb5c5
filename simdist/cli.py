"""The ``simdist`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

# Only what --version and --help need is imported here: they answer without importing torch
# (tests/fuzz_runner/test_cli_fast.py); each command imports what it runs.
from ._version import DISTRIBUTION, version

if TYPE_CHECKING:
    from .layout import Layout

__all__ = ["DISTRIBUTION", "main", "version"]


def _layout(text: str) -> Layout:
    """'tp=2,dp=2,pp=2' -> Layout."""
    from .layout import Layout

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
    argv_list = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="simdist", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo_p = sub.add_parser("demo", help="run one real TP x PP x DP training step and check parity")
    demo_p.add_argument("--layout", type=_layout, default=None, help="e.g. tp=2,dp=2,pp=2")
    # The fuzz commands need Hypothesis and pytest (test extras): imported only when asked for.
    if len(argv_list) >= 1 and argv_list[0] in ("fuzz", "replay"):
        # `python -m simdist` puts the current directory first on sys.path and
        # the console script does not: make both find the user's modules
        # (a --database python:module:name, a target's helpers) the same way.
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            from .fuzz._cli import add_fuzz_parser, add_replay_parser, fuzz_command, replay_command
        except ImportError as exc:
            print(
                f"simdist {argv_list[0]}: needs Hypothesis and pytest, the test extras "
                f"(pip install 'torch-simdist[test]', or pip install -e '.[test]' in a clone): {exc}",
                file=sys.stderr,
            )
            return 2

        add_fuzz_parser(sub)
        add_replay_parser(sub)
    else:
        sub.add_parser("fuzz", help="run a fuzz campaign (simdist fuzz --help)", add_help=False)
        sub.add_parser("replay", help="re-run failing fuzz cases (simdist replay --help)", add_help=False)
    args = parser.parse_args(argv_list)
    if args.command == "demo":
        from .demo import demo

        return demo(args.layout)
    if args.command == "fuzz":
        return fuzz_command(args)
    if args.command == "replay":
        return replay_command(args)
    return 2  # unreachable: argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
