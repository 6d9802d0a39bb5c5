"""What the run token costs: small collectives under each schedule, side by side.

Prints, measured in this one run and interleaved (so machine load hits every
column alike):

* per-call latency of a small all_reduce and of a send/recv ping-pong under
  schedule="concurrent" (free-running rank threads, no per-rank process state:
  how simdist ran before the run token), "rank" and "random";
* the ratio of each scheduled mode to the concurrent one;
* a compute-heavy step (matmuls that release the GIL, then a small
  all_reduce) under each schedule, with one intra-op thread per rank as
  torchrun gives each process: where letting every rank run at once pays;
* the cost of one state swap (torch, random, numpy generators) on its own.

Latencies are timed inside each rank after a warm-up; the slowest rank's mean
per call, median over repeats. Prints, never asserts.

    python benchmarks/scheduling.py --sizes 2,8 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import timeit
from pathlib import Path

import torch
import torch.distributed as dist

try:
    import simdist
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import simdist

from simdist._isolation.rank_state import RankStates

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectives import time_all_reduce

SCHEDULES = ("concurrent", "rank", "random")


def all_reduce_body(ctx: simdist.RankContext, iters: int) -> float:
    return time_all_reduce(ctx, 8, 10, iters)


def ping_pong_body(ctx: simdist.RankContext, iters: int) -> float:
    t = torch.ones(8)
    peer = ctx.rank ^ 1
    start = 0.0
    for i in range(iters + 10):
        if i == 10:
            start = time.perf_counter()
        if ctx.rank % 2 == 0:
            dist.send(t, dst=peer)
            dist.recv(t, src=peer)
        else:
            dist.recv(t, src=peer)
            dist.send(t, dst=peer)
    return (time.perf_counter() - start) / iters


def compute_body(ctx: simdist.RankContext, iters: int) -> float:
    """Per step: four 384x384 matmuls (torch releases the GIL inside them),
    then a small all_reduce, as a rank of a compute-bound training step."""
    a = torch.randn(384, 384, generator=torch.Generator().manual_seed(ctx.rank))
    t = torch.ones(8)
    start = 0.0
    for i in range(iters + 2):
        if i == 2:
            start = time.perf_counter()
        b = a
        for _ in range(4):
            b = b @ a
            b = b / b.norm()
        dist.all_reduce(t)
    return (time.perf_counter() - start) / iters


def measure(body, n: int, iters: int, repeats: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {s: [] for s in SCHEDULES}
    for r in range(repeats):
        for schedule in SCHEDULES:  # interleaved: load changes hit every column
            per_rank = simdist.run(
                body, world_size=n, args=(iters,), schedule=schedule, schedule_seed=r, timeout=300.0
            )
            samples[schedule].append(max(per_rank))
    return {s: statistics.median(v) for s, v in samples.items()}


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2,8", help="world sizes, comma separated (default 2,8)")
    parser.add_argument("--iters", type=int, default=200, help="timed calls per rank (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="worlds per schedule (default 5)")
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]

    states = RankStates(8)
    which = iter(range(10**9))
    swap = timeit.timeit(lambda: states.switch_to(next(which) % 8), number=2000) / 2000
    states.restore_caller()
    print(f"one state swap (torch + random + numpy generators): {fmt(swap)}\n")

    threads = torch.get_num_threads()
    for title, body, iters in (
        ("Small all_reduce (8 float32), per call", all_reduce_body, opts.iters),
        ("send/recv ping-pong between rank pairs (8 float32), per round trip", ping_pong_body, opts.iters),
        (
            f"Compute-heavy step (4 matmuls 384x384 + small all_reduce), one intra-op thread, "
            f"{os.cpu_count()} CPUs, per step",
            compute_body,
            max(10, opts.iters // 10),
        ),
    ):
        torch.set_num_threads(1 if body is compute_body else threads)
        print(title)
        print("ranks  concurrent       rank     random  rank/concurrent  random/concurrent")
        print("-----  ----------  ---------  ---------  ---------------  -----------------")
        for n in sizes:
            m = measure(body, n, iters, opts.repeats)
            print(
                f"{n:5d}  {fmt(m['concurrent']):>10}  {fmt(m['rank']):>9}  {fmt(m['random']):>9}  "
                f"{m['rank'] / m['concurrent']:14.2f}x  {m['random'] / m['concurrent']:16.2f}x"
            )
        print()


if __name__ == "__main__":
    main()
