"""The engine's speed mechanisms, each measured alone: the same tree with one
of them off, against all of them on, in alternating child processes.

Mechanisms (docs/internals.md, "Speed mechanisms: the audit"):

- ``generator fingerprints``: the process's random generators (torch's CPU
  one, ``random``'s, numpy's) read in place at a switch to skip those the
  ranks never drew from; off, each switch reads them through their APIs.
- ``affinity pins``: the rank handing the run token on pins the next holder
  to its own CPU (``SIMDIST_HANDOFF_AFFINITY=0`` turns it off).
- ``thread pool``: finished rank threads park and serve the next run
  (``SIMDIST_REUSE_THREADS=0`` turns it off).
- ``emulation's own calls unhandled``: under ``cuda="emulate"``, the
  dispatch mode's and the memory counts' own tensor calls run with torch
  function handling off (each would go through the emulated tensor's
  handlers); off, they go through them.
- ``prepared c10d init``: each rank's default group made from arguments
  prepared once per run (``_isolation/c10d_init``); off, c10d's whole
  ``init_process_group`` per rank.
- removed after their rows here (docs/internals.md): lock latches in place
  of ``threading.Event``, rank threads started in a tree, and the caller's
  generator snapshots kept from one run for the next; none gained.
- ``all reuse off``: ``SIMDIST_REUSE=0`` (no parked threads, no kept
  snapshots, c10d's whole init per rank).

Each child times, per world, ``--calls`` small all_reduces (16 floats, a
``t.add_(1)`` between them, the default scheduled mode) in one run, and
empty runs (start and teardown), after a warm-up, and reports medians.
The table is the median over rounds per variant, its spread (lowest and
highest round) and the ratio to ``all on``; a mechanism gains what its
``off`` row costs more. Prints, never asserts.

    python benchmarks/mechanisms.py --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from _harness import alternate, child_json, load_line, table

VARIANTS = {
    "all on": {},
    "generator fingerprints off": {"SIMDIST_BENCH_FINGERPRINTS": "0"},
    "affinity pins off": {"SIMDIST_HANDOFF_AFFINITY": "0"},
    "thread pool off": {"SIMDIST_REUSE_THREADS": "0"},
    "emulation's own calls handled": {"SIMDIST_BENCH_EMULATION_HANDLED": "1"},
    "prepared c10d init off": {"SIMDIST_BENCH_PREPARED_INIT": "0"},
    "all reuse off": {"SIMDIST_REUSE": "0"},
}


def _switched_off() -> None:
    """Turn off the mechanisms this child's environment names (see VARIANTS)."""
    from simdist._isolation import c10d_init

    if os.environ.get("SIMDIST_BENCH_FINGERPRINTS") == "0":
        _fingerprints_off()
    if os.environ.get("SIMDIST_BENCH_EMULATION_HANDLED") == "1":
        _emulation_calls_handled()
    if os.environ.get("SIMDIST_BENCH_PREPARED_INIT") == "0":
        c10d_init._torch_tested = lambda: False


def _fingerprints_off() -> None:
    """Every generator read through its API at each switch, as without the fingerprints."""
    from simdist._isolation import generators

    generators._TORCH_CPU_FINGERPRINT = None
    generators._python_random_fingerprint = lambda: None
    generators._numpy_fingerprint = lambda: None


def _emulation_calls_handled() -> None:
    """The emulation's own tensor calls through the emulated tensor's handlers."""
    import contextlib

    from simdist._cuda import memory, mode

    mode._NO_TORCH_FUNCTION = contextlib.nullcontext  # type: ignore[assignment]
    memory._NO_TORCH_FUNCTION = contextlib.nullcontext  # type: ignore[assignment]


def _per_op(op: Any, repeats: int = 5, calls: int = 400) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            op()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def _child(
    calls: int, runs: int, collective_worlds: list[int], empty_worlds: list[int], first_worlds: list[int]
) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    import simdist

    _switched_off()

    def reduce_body(ctx: Any) -> None:
        t = torch.zeros(16)
        for _ in range(calls):
            t.add_(1)
            dist.all_reduce(t)

    def empty_body(ctx: Any) -> None:
        return None

    out: dict[str, float] = {}
    for world in first_worlds:  # before any other run: new threads, a cold process
        t0 = time.perf_counter()
        simdist.run(empty_body, world_size=world)
        out[f"first run, {world} ranks"] = time.perf_counter() - t0
    for world in collective_worlds:
        simdist.run(reduce_body, world_size=world)
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            simdist.run(reduce_body, world_size=world)
            walls.append((time.perf_counter() - t0) / calls)
        out[f"all_reduce, {world} ranks"] = statistics.median(walls)
    for world in empty_worlds:
        for _ in range(3):
            simdist.run(empty_body, world_size=world)
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            simdist.run(empty_body, world_size=world)
            walls.append(time.perf_counter() - t0)
        out[f"start + teardown, {world} ranks"] = statistics.median(walls)

    def emulated_ops(ctx: Any) -> dict[str, float]:
        x = torch.zeros(16, device="cuda")
        return {
            "emulated zeros(16), 1 rank": _per_op(lambda: torch.zeros(16, device="cuda")),
            "emulated x.sum(), 1 rank": _per_op(lambda: x.sum()),
            "emulated x.add_(1), 1 rank": _per_op(lambda: x.add_(1)),
        }

    out.update(simdist.run(emulated_ops, world_size=1, cuda="emulate")[0])
    print(json.dumps(out))


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--collective-worlds", default="2,8")
    parser.add_argument("--empty-worlds", default="8,64")
    parser.add_argument("--first-worlds", default="256", help="first run of a fresh process, these sizes")
    parser.add_argument("--variants", default="", help="comma-separated subset of VARIANTS ('all on' always)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    collective = [int(w) for w in args.collective_worlds.split(",") if w]
    empty = [int(w) for w in args.empty_worlds.split(",") if w]
    first = [int(w) for w in args.first_worlds.split(",") if w]
    if args.child:
        _child(args.calls, args.runs, collective, empty, first)
        return
    chosen = (
        ["all on"] + [v for v in args.variants.split(",") if v and v != "all on"]
        if args.variants
        else list(VARIANTS)
    )
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    print(load_line("at the start"))
    child_args = ["--child", "--calls", args.calls, "--runs", args.runs]
    child_args += ["--collective-worlds", args.collective_worlds, "--empty-worlds", args.empty_worlds]
    child_args += ["--first-worlds", args.first_worlds]

    def measure(variant: str) -> dict[str, Any]:
        return child_json(__file__, child_args, extra_env=VARIANTS[variant], timeout=900)

    samples = alternate(chosen, args.rounds, measure)
    rows = []
    for key in samples["all on"][0]:
        base = statistics.median(s[key] for s in samples["all on"])
        for variant in chosen:
            values = [s[key] for s in samples[variant]]
            median = statistics.median(values)
            rows.append(
                [
                    key,
                    variant,
                    _fmt(median),
                    f"{_fmt(min(values))} - {_fmt(max(values))}",
                    f"{median / base:.2f}x",
                ]
            )
    table(["measure", "variant", "median", "spread (rounds)", "x all on"], rows, markdown=True)
    print(load_line("at the end"), file=sys.stdout)


if __name__ == "__main__":
    main()
