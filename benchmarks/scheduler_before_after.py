"""The scheduler before and after the _core split, side by side in one process.

Loads the pre-split scheduler (``simdist/rendezvous.py`` at ``--before``, a git
commit, default 4934cfa) next to today's ``simdist._core.scheduler`` and runs
the same worlds with each, alternating (the order flips every repeat), so load
from other processes hits both alike. Prints medians and new/old ratios for:
a small all_reduce per call (concurrent and scheduled), a send/recv round
trip, a 2-level helper-thread collective, and an empty world's start and
teardown. Prints, never asserts.

    python benchmarks/scheduler_before_after.py [--before COMMIT] [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

try:
    import simdist
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import simdist
import simdist._core.waitfor
import simdist._run.world
from simdist._core.scheduler import Scheduler as NewScheduler


def load_old_scheduler(commit: str) -> type:
    """The pre-split ``Scheduler`` class, loaded as a module of the simdist package."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{commit}:simdist/rendezvous.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    # Its relative imports: ``.waitfor`` has moved into _core since.
    sys.modules.setdefault("simdist.waitfor", simdist._core.waitfor)
    path = Path(tempfile.mkdtemp()) / "old_rendezvous.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("simdist._old_rendezvous", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Scheduler


def all_reduce_latency(ctx: simdist.RankContext, calls: int) -> tuple[float, float]:
    """(wall seconds per call, this rank's CPU seconds per call)."""
    t = torch.ones(8)
    for _ in range(20):
        dist.all_reduce(t)
    dist.barrier()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / calls, (time.thread_time() - cpu) / calls


def send_recv_latency(ctx: simdist.RankContext, calls: int) -> tuple[float, float]:
    t = torch.ones(8)
    peer = 1 - ctx.rank
    dist.barrier()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        if ctx.rank == 0:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)
    return (time.perf_counter() - start) / calls / 2, (time.thread_time() - cpu) / calls / 2


def empty(ctx: simdist.RankContext) -> int:
    return ctx.rank


def timed_world(n: int, body: Callable[..., Any], **kwargs: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the whole process) of one run."""
    start, cpu = time.perf_counter(), time.process_time()
    simdist.run(body, world_size=n, timeout=300, **kwargs)
    return time.perf_counter() - start, time.process_time() - cpu


def per_call(results: list[tuple[float, float]]) -> tuple[float, float]:
    """The slowest rank's wall time, and the CPU all ranks spent, per call."""
    return max(w for w, _ in results), sum(c for _, c in results)


def cases() -> list[tuple[str, Callable[[], tuple[float, float]]]]:
    out: list[tuple[str, Callable[[], tuple[float, float]]]] = []
    for n in (2, 4, 8, 16):
        calls = 300 if n <= 8 else 100
        out.append(
            (
                f"all_reduce, {n} ranks, concurrent",
                lambda n=n, c=calls: per_call(simdist.run(all_reduce_latency, world_size=n, args=(c,))),
            )
        )
    for n in (2, 8):
        out.append(
            (
                f"all_reduce, {n} ranks, schedule='rank'",
                lambda n=n: per_call(
                    simdist.run(all_reduce_latency, world_size=n, args=(200,), schedule="rank")
                ),
            )
        )
    out.append(
        (
            "send/recv, 2 ranks, concurrent",
            lambda: per_call(simdist.run(send_recv_latency, world_size=2, args=(300,))),
        )
    )
    for n in (8, 64):
        out.append((f"empty world start+teardown, {n} ranks", lambda n=n: timed_world(n, empty)))
    return out


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e6:7.1f} us" if seconds < 0.01 else f"{seconds * 1e3:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", default="4934cfa", help="git commit of the pre-split scheduler")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    impls = {"old": load_old_scheduler(args.before), "new": NewScheduler}
    load = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, load average {load:.2f} (noisy when others run)"
    )
    print("wall: the slowest rank per call (world: the run); cpu: every thread's CPU per call (world: the")
    print("process's), less disturbed by load. Medians over repeats, old and new alternating.")
    print(
        f"{'case':40s} {'old wall':>10s} {'new wall':>10s} {'ratio':>6s} {'old cpu':>10s} {'new cpu':>10s} {'ratio':>6s}"
    )
    for name, measure in cases():
        times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        measure()  # warm-up
        for rep in range(args.repeats):
            order = ("old", "new") if rep % 2 == 0 else ("new", "old")
            for impl in order:
                simdist._run.world.Scheduler = impls[impl]  # type: ignore[misc]
                try:
                    times[impl].append(measure())
                finally:
                    simdist._run.world.Scheduler = NewScheduler  # type: ignore[misc]
        cells = []
        for k in (0, 1):
            old = statistics.median(t[k] for t in times["old"])
            new = statistics.median(t[k] for t in times["new"])
            cells.append(f"{_fmt(old)} {_fmt(new)} {new / old:5.2f}x")
        print(f"{name:40s} " + " ".join(cells))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
