"""What the collective sanitizer costs: the same work with ``check_async`` on and off, side by side.

Three workloads, each run with the sanitizer off and on, alternating, in this
one process (best of ``--repeats`` worlds each):

* a synchronous all_reduce loop: nothing is ever left in flight, so the mode
  never goes on a thread's stack; what remains is the registry's bookkeeping
  per call;
* one real client step: a 2-layer MLP under DDP (bucketed all-reduce in
  backward), forward, backward and an SGD step;
* an async loop: all_reduce(async_op=True), some tensor ops while it is in
  flight (each one checked), then wait.

Prints the per-call or per-step time of each side, the on/off ratio, and the
load average before and after (figures taken on a loaded machine are noise:
measure alone, and read the ratios, not the times). Prints, never asserts.

    python benchmarks/sanitizer_cost.py
    python benchmarks/sanitizer_cost.py --quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

try:
    import simdist
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import simdist

WORLD = 2


def sync_loop(ctx: simdist.RankContext, n: int) -> float:
    t = torch.ones(8)
    dist.all_reduce(t)  # warm-up
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / n


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


WORKLOADS: dict[str, tuple[Callable[..., float], int, str]] = {
    "sync all_reduce": (sync_loop, 2000, "per call"),
    "DDP step": (client_step, 50, "per step"),
    "async all_reduce + 4 ops": (async_loop, 500, "per iteration"),
}


def measure(fn: Callable[..., float], n: int, check: bool) -> float:
    return max(simdist.run(fn, world_size=WORLD, args=(n,), check_async=check))  # the slowest rank


def load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations and repeats (a smoke test)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    print(f"load average before: {load()}  (1, 5, 15 min; figures under load are noise)")
    print(f"{'workload':28} {'off':>12} {'on':>12} {'on/off':>8}")
    for name, (fn, n, unit) in WORKLOADS.items():
        n = max(5, n // 20) if args.quick else n
        off: list[float] = []
        on: list[float] = []
        for _ in range(repeats):  # alternating, so drifting load hits both sides alike
            off.append(measure(fn, n, False))
            on.append(measure(fn, n, True))
        a, b = min(off), min(on)
        print(f"{name:28} {a * 1e6:9.1f} us {b * 1e6:9.1f} us {b / a:8.2f}  ({unit}, {WORLD} ranks)")
    print(f"load average after:  {load()}")


if __name__ == "__main__":
    main(sys.argv[1:])
