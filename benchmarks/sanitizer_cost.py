"""What the collective sanitizer costs: the same work with ``check_async`` on and off, side by side.

Workloads, each run with the sanitizer off and on, alternating, in this one
process (best of ``--repeats`` worlds each):

* a synchronous all_reduce loop: c10d waits for each call at once, so it never
  goes in flight: no entry, no mode on the stack;
* ``benchmarks/collectives.py``'s own workloads: its small (8 floats) and
  large (1M floats) all_reduce, and its 100 small collectives spread over the
  tp, dp, pp and world groups of a layout;
* one real client step: a 2-layer MLP under DDP (bucketed all-reduce in
  backward, issued from C++ with default options: in flight until waited),
  forward, backward and an SGD step;
* an async loop: all_reduce(async_op=True), some tensor ops while it is in
  flight (each one checked), then wait.

For each it prints the time per call (or step) off and on and their ratio,
and the Python function calls one rank makes per call (or step), off and on:
counted with ``sys.setprofile`` on the rank threads over two loop lengths and
differenced, so warm-up and first-use caches drop out. The counts are
deterministic and hold on a loaded machine; the times do not (the load
average is printed before and after: measure alone, read the ratios). Prints,
never asserts.

    python benchmarks/sanitizer_cost.py
    python benchmarks/sanitizer_cost.py --quick
    python benchmarks/sanitizer_cost.py --counts-only
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _harness import load_line

try:
    import simdist
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import simdist

# collectives.py's rank bodies, imported by bare name: a benchmark run as
# ``python benchmarks/NAME.py`` has this folder first on its path.
import collectives

WORLD = 2


# --------------------------------------------------------------------------- #
# Rank bodies: each takes the loop length ``n`` and returns seconds per unit
# --------------------------------------------------------------------------- #


def sync_loop(ctx: simdist.RankContext, n: int) -> float:
    t = torch.ones(8)
    dist.all_reduce(t)  # warm-up
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / n


def small_all_reduce(ctx: simdist.RankContext, n: int) -> float:
    return collectives.time_all_reduce(ctx, collectives.SMALL_NUMEL, 5, n)


def large_all_reduce(ctx: simdist.RankContext, n: int) -> float:
    return collectives.time_all_reduce(ctx, collectives.LARGE_NUMEL, 1, n)


def hundred_collectives(ctx: simdist.RankContext, n: int) -> float:
    collectives.hundred_collectives(ctx)  # warm-up
    start = time.perf_counter()
    for _ in range(n):
        collectives.hundred_collectives(ctx)
    return (time.perf_counter() - start) / (100 * n)


def client_step(ctx: simdist.RankContext, n: int) -> float:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 8)

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    step()  # warm-up (DDP rebuilds its buckets after the first)
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def async_loop(ctx: simdist.RankContext, n: int) -> float:
    t, other = torch.ones(8), torch.ones(8)
    start = time.perf_counter()
    for _ in range(n):
        work = dist.all_reduce(t, async_op=True)
        for _ in range(4):  # overlapped compute on other memory: checked, not refused
            other.mul_(1.0)
        work.wait()
    return (time.perf_counter() - start) / n


@dataclass(frozen=True)
class Workload:
    name: str
    body: Callable[[simdist.RankContext, int], float]
    n: int  # loop length of a timed world
    unit: str
    world: dict[str, Any] = field(default_factory=lambda: {"world_size": WORLD})
    per_loop: int = 1  # units in one iteration of the body's loop
    counted: tuple[int, int] = (10, 40)  # the two loop lengths whose call counts are differenced

    @property
    def ranks(self) -> str:
        if "layout" in self.world:
            return str(self.world["layout"])
        return f"{self.world['world_size']} ranks"


WORKLOADS = [
    Workload("sync all_reduce", sync_loop, 2000, "per call"),
    Workload("collectives.py small all_reduce", small_all_reduce, 2000, "per call"),
    Workload("collectives.py small all_reduce", small_all_reduce, 500, "per call", {"world_size": 8}),
    Workload("collectives.py 1M all_reduce", large_all_reduce, 20, "per call", counted=(2, 8)),
    Workload(
        "collectives.py 100 collectives",
        hundred_collectives,
        10,
        "per call",
        {"layout": simdist.Layout(tp=2, dp=2, pp=2)},
        per_loop=100,
        counted=(1, 3),
    ),
    Workload("DDP step", client_step, 50, "per step", counted=(3, 12)),
    Workload("async all_reduce + 4 ops", async_loop, 500, "per iteration"),
]


# --------------------------------------------------------------------------- #
# Measuring
# --------------------------------------------------------------------------- #


def measure(work: Workload, n: int, check: bool) -> float:
    """Seconds per unit on the slowest rank of one world."""
    return max(simdist.run(work.body, args=(n,), check_async=check, **work.world))


def _counted(ctx: simdist.RankContext, body: Callable[[simdist.RankContext, int], float], n: int) -> int:
    """The Python function calls this rank thread makes running ``body``."""
    calls = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[0] += 1

    sys.setprofile(profile)
    try:
        body(ctx, n)
    finally:
        sys.setprofile(None)
    return calls[0]


def calls_per_unit(work: Workload, check: bool) -> float:
    """One rank's Python calls per unit: two loop lengths, differenced (the
    warm-up and first-use caches cancel), averaged over the ranks. Long
    enough loops that the scheduler's few paths (a wait that finds its call
    done, or blocks) average out to a tenth of a call."""
    short, long = work.counted
    measure(work, short, check)  # first use in this process (imports, caches): not counted
    counts = []
    for n in (short, long):
        per_rank = simdist.run(_counted, args=(work.body, n), check_async=check, **work.world)
        counts.append(sum(per_rank) / len(per_rank))
    return (counts[1] - counts[0]) / ((long - short) * work.per_loop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations and repeats (a smoke test)")
    parser.add_argument("--counts-only", action="store_true", help="the call counts, no timing")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    if not args.counts_only:
        print(f"{load_line('at the start')}  (times under load are noise, counts are not)")
    print(
        f"{'workload':34} {'ranks':>31} {'off':>10} {'on':>10} {'on/off':>7}"
        f" {'calls off':>10} {'calls on':>9}  unit"
    )
    for work in WORKLOADS:
        counts = [calls_per_unit(work, check) for check in (False, True)]
        times = "-", "-", "-"
        if not args.counts_only:
            n = max(5, work.n // 20) if args.quick else work.n
            off: list[float] = []
            on: list[float] = []
            for _ in range(repeats):  # alternating, so drifting load hits both sides alike
                off.append(measure(work, n, False))
                on.append(measure(work, n, True))
            a, b = min(off), min(on)
            times = f"{a * 1e6:.1f} us", f"{b * 1e6:.1f} us", f"{b / a:.2f}"
        print(
            f"{work.name:34} {work.ranks:>31} {times[0]:>10} {times[1]:>10} {times[2]:>7}"
            f" {counts[0]:10.1f} {counts[1]:9.1f}  {work.unit}"
        )
    if not args.counts_only:
        print(load_line("at the end"))


if __name__ == "__main__":
    main(sys.argv[1:])
