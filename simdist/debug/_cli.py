"""The command line's debugging options: ``simdist replay --pdb/--break-at``, ``simdist fuzz --trace-failures``."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ._options import TRACE_ENV, BreakAt, defaults, parse_break_at, set_trace_env

DEFAULT_FUZZ_TRACES = ".simdist/fuzz-traces"


def _break_at(text: str) -> BreakAt:
    try:
        spec = parse_break_at(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert spec is not None
    return spec


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pdb",
        action="store_true",
        help="open the debugger in a failing rank's own frame, every other rank frozen",
    )
    p.add_argument(
        "--break-at",
        type=_break_at,
        default=None,
        metavar="rank=R[,op=OP][,nth=N][,seq=S][,group=G]",
        help="stop rank R in the debugger just before that call (e.g. rank=1,seq=5)",
    )


def replay_scope(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """Every run of the replayed cases debugs as the options ask."""
    settings: dict[str, Any] = {}
    if getattr(args, "pdb", False):
        settings["post_mortem"] = True
    if getattr(args, "break_at", None) is not None:
        settings["break_at"] = args.break_at
    return defaults(**settings) if settings else contextlib.nullcontext()


def add_fuzz_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace-failures",
        nargs="?",
        const=DEFAULT_FUZZ_TRACES,
        default=None,
        metavar="DIR",
        help=f"write the Perfetto trace of each failing run (default DIR {DEFAULT_FUZZ_TRACES}); "
        "per property, the last one written is the shrunk case's",
    )


@contextlib.contextmanager
def fuzz_scope(args: argparse.Namespace) -> Iterator[None]:
    """Within the block the campaign's workers inherit the environment: each
    writes its failing runs' traces. The environment is put back afterwards
    (a campaign started in-process must not leave trace-on-failure on for the
    runs after it)."""
    folder = getattr(args, "trace_failures", None)
    if folder is None:
        yield
        return
    os.makedirs(folder, exist_ok=True)
    previous = os.environ.get(TRACE_ENV)
    set_trace_env(os.path.abspath(folder))
    try:
        yield
    finally:
        set_trace_env(previous)
