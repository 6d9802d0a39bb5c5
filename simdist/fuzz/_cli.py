"""``simdist fuzz`` and ``simdist replay``: argument parsing and exit codes."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import fields
from pathlib import Path

from ..debug import _cli as debug_cli
from ._campaign import CampaignConfig, ExitCode, UsageError, default_targets, run_campaign
from ._corpus import CaseFileError, read_case, replay_case
from ._property import telling_interrupts_apart

__all__ = ["add_fuzz_parser", "add_replay_parser", "fuzz_command", "replay_command"]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _workers(text: str) -> int:
    if text == "auto":
        return max(1, os.cpu_count() or 1)
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}")
    return int(text)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_fuzz_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fuzz",
        help="run a fuzz campaign of Hypothesis properties under a wall-clock budget",
        description="Run Hypothesis properties again and again with fresh seeds until the budget is spent. "
        "Exit 0 when clean, 1 when a property failed, 2 on usage or target errors, "
        "3 when simdist's own machinery or its environment (the example database) broke.",
    )
    p.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="pytest node ids, files or directories of properties "
        "(default: [tool.simdist] fuzz-targets in pyproject.toml, else tests/fuzz)",
    )
    p.add_argument(
        "--budget", type=_positive_float, default=60.0, help="wall-clock seconds of search (default 60)"
    )
    p.add_argument("--seed", type=int, default=None, help="campaign seed (default: a fresh one, printed)")
    p.add_argument(
        "--workers", type=_workers, default=1, help="worker processes sharing one example database, or 'auto'"
    )
    p.add_argument(
        "--max-world-size",
        type=_positive_int,
        default=None,
        help="largest world the properties may draw (exported as SIMDIST_FUZZ_MAX_WORLD_SIZE)",
    )
    p.add_argument(
        "--database",
        default=".simdist/fuzz-db",
        help="example database: a directory (default .simdist/fuzz-db), 'none', "
        "or python:module:name of an ExampleDatabase",
    )
    p.add_argument(
        "--corpus",
        default="auto",
        help="directory where failing cases are written as JSON (default: [tool.simdist] corpus "
        "in the pyproject.toml of the target's rootdir, else fuzz-cases/ in that rootdir)",
    )
    p.add_argument("--no-corpus", action="store_true", help="do not write failing cases")
    p.add_argument("--report", type=Path, default=None, help="write the campaign as JSON")
    p.add_argument("--junit", type=Path, default=None, help="write a JUnit XML report")
    p.add_argument(
        "-x", "--stop-on-failure", action="store_true", help="stop at the first failure (once shrunk)"
    )
    p.add_argument(
        "--grace",
        type=_positive_float,
        default=120.0,
        help="seconds past the budget that failures may still be shrunk (default 120); "
        "then workers stop and report the smallest case found so far",
    )
    p.add_argument(
        "--case-timeout",
        type=_positive_float,
        default=300.0,
        help="seconds one case may run (default 300); a case past it is reported as a failure "
        "(CaseTimeout) with its case, and that worker stops",
    )
    p.add_argument(
        "--startup",
        type=_positive_float,
        default=300.0,
        help="seconds a worker may take to import and collect the target (default 300); "
        "the budget is counted from each worker's readiness",
    )
    p.add_argument(
        "--tag",
        type=_tag,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recorded in the report and in every case file written",
    )
    debug_cli.add_fuzz_arguments(p)  # debug hook: --trace-failures


def add_replay_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="re-run failing cases written by a campaign",
        description="Run each case once. Exit 0 when every case passes, 1 while any still fails, "
        "2 when a file cannot be read or its property not found.",
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="case files (or directories of them)")
    debug_cli.add_replay_arguments(p)  # debug hook: --pdb, --break-at


def fuzz_command(args: argparse.Namespace) -> int:
    with debug_cli.fuzz_scope(args):  # debug hook: --trace-failures, for the campaign's workers
        try:
            # The options are CampaignConfig's fields under the same names; targets, corpus and tags need more.
            options = {f.name: getattr(args, f.name) for f in fields(CampaignConfig) if hasattr(args, f.name)}
            options["targets"] = list(args.targets) or default_targets()
            corpus = None if args.no_corpus else args.corpus
            options["corpus"] = corpus if corpus in (None, "auto") else Path(corpus)
            options["tags"] = dict(args.tag)
            return run_campaign(CampaignConfig(**options)).exit_code
        except UsageError as exc:
            print(f"simdist fuzz: error: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        except KeyboardInterrupt:
            return ExitCode.INTERRUPTED
        except Exception:
            print("simdist fuzz: internal error (a bug in simdist, not in the target):", file=sys.stderr)
            traceback.print_exc()
            return ExitCode.CRASHED


def _expand(paths: list[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.json")) if path.is_dir() else [path])
    return files


def replay_command(args: argparse.Namespace) -> int:
    files = _expand(args.files)
    if not files:
        print("simdist replay: error: no case files found", file=sys.stderr)
        return ExitCode.USAGE
    still_failing = unusable = 0
    for path in files:
        # Read first, on its own: a damaged file is unusable (exit 2) and is
        # never reported under another file's target.
        try:
            case = read_case(path)
        except CaseFileError as exc:
            unusable += 1
            print(_unusable(path, exc))
            continue
        try:
            # A property's own sys.exit()/KeyboardInterrupt is the case failing
            # again, as in the campaign; a Ctrl-C still stops the replay.
            with debug_cli.replay_scope(args), telling_interrupts_apart():  # debug hook: --pdb, --break-at
                replay_case(path)
        except CaseFileError as exc:
            unusable += 1
            print(_unusable(path, exc))
            continue
        except (Exception, SystemExit) as exc:
            still_failing += 1
            first = str(exc).strip().splitlines()[:8]
            print(f"FAILS  {path}  {case.target}\n       {type(exc).__name__}: " + "\n       ".join(first))
            continue
        print(f"passes {path}  {case.target}")
    print(
        f"{len(files)} case(s): {len(files) - still_failing - unusable} pass, {still_failing} still fail, "
        f"{unusable} unusable"
    )
    if unusable:
        return ExitCode.USAGE
    return ExitCode.FAILED if still_failing else ExitCode.CLEAN


def _unusable(path: Path, exc: CaseFileError) -> str:
    """The ERROR line of a file that cannot be replayed (its path once: the
    reader's messages already begin with it)."""
    text = str(exc)
    return f"ERROR  {text}" if text.startswith(f"{path}:") else f"ERROR  {path}: {text}"
