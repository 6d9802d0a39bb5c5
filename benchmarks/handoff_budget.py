"""Where the time of a small simulated all_reduce goes, measured side by side.

Prints, from one run:
* the thread-handoff cost: a lock ping-pong between two Python threads
  (two handoffs per round trip), and an 8-thread baton ring;
* the CPU one rank spends per small all_reduce call in a 1-rank world, split
  into torch.distributed's own wrapper and simdist's process group;
* for each world size, the measured per-call latency next to the bare ring
  floor and a ring whose threads each spend one call's CPU per hop, which any
  thread-per-rank design under one GIL pays, since every rank runs its own
  Python for every call;
* simdist with a finished collective's members woken one at a time (the
  default) against all at once, alternating in the same process.

Prints ratios; never asserts.

    python benchmarks/handoff_budget.py
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import torch.distributed as dist

import simdist
from simdist._core.scheduler import Scheduler


def ping_pong_handoff(rounds: int = 5000) -> float:
    """Seconds per handoff between two threads blocked on locks."""
    a, b = threading.Lock(), threading.Lock()
    a.acquire()
    b.acquire()

    def other() -> None:
        for _ in range(rounds):
            a.acquire()
            b.release()

    thread = threading.Thread(target=other)
    thread.start()
    start = time.perf_counter()
    for _ in range(rounds):
        a.release()
        b.acquire()
    elapsed = time.perf_counter() - start
    thread.join()
    return elapsed / rounds / 2


def _busy(seconds: float) -> None:
    if seconds > 0:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass


def ring_handoff(threads: int = 8, rounds: int = 1000, work: float = 0.0) -> float:
    """Seconds per hop when a baton goes round a ring of blocked threads, each
    doing ``work`` seconds of Python before passing it on."""
    locks = [threading.Lock() for _ in range(threads)]
    for lock in locks:
        lock.acquire()

    def member(i: int) -> None:
        for _ in range(rounds):
            locks[i].acquire()
            _busy(work)
            locks[(i + 1) % threads].release()

    workers = [threading.Thread(target=member, args=(i,)) for i in range(1, threads)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    for _ in range(rounds):
        _busy(work)
        locks[1].release()
        locks[0].acquire()
    elapsed = time.perf_counter() - start
    for w in workers:
        w.join()
    return elapsed / rounds / threads


def _cpu_per_call(ctx: simdist.RankContext, calls: int) -> tuple[float, float]:
    t = torch.ones(8)
    group = ctx.groups.world
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    for _ in range(200):
        dist.all_reduce(t)
    start = time.thread_time()
    for _ in range(calls):
        dist.all_reduce(t)
    full = (time.thread_time() - start) / calls
    start = time.thread_time()
    for _ in range(calls):
        group.allreduce([t], opts).wait()
    direct = (time.thread_time() - start) / calls
    return full, direct


def _latency(ctx: simdist.RankContext, calls: int) -> float:
    t = torch.ones(8)
    for _ in range(30):
        dist.all_reduce(t)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="2,4,8,32", help="world sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    ping = statistics.median(ping_pong_handoff() for _ in range(args.repeats))
    ring = statistics.median(ring_handoff() for _ in range(args.repeats))
    cpu = [simdist.run(_cpu_per_call, world_size=1, args=(5000,))[0] for _ in range(args.repeats)]
    full = statistics.median(c[0] for c in cpu)
    direct = statistics.median(c[1] for c in cpu)
    print(
        f"handoff, two-thread lock ping-pong: {ping * 1e6:.1f} us; 8-thread baton ring: {ring * 1e6:.1f} us"
    )
    print(
        f"CPU per small all_reduce call, one rank: {full * 1e6:.1f} us "
        f"(torch.distributed wrapper {max(full - direct, 0) * 1e6:.1f} us, simdist {direct * 1e6:.1f} us)"
    )
    print()
    print("ranks  measured  floor(ring)  x floor  ring with work  x ring with work")
    for n in sizes:
        calls = 300 if n <= 8 else 60
        measured = statistics.median(
            max(simdist.run(_latency, world_size=n, args=(calls,))) for _ in range(args.repeats)
        )
        floor = (n - 1) * ring
        # The same ring, each thread busy for one call's CPU before passing the
        # baton: what any thread-per-rank design with this much Python per call pays.
        loaded = n * statistics.median(
            ring_handoff(threads=n, rounds=300 if n <= 8 else 60, work=full) for _ in range(args.repeats)
        )
        print(
            f"{n:5d}  {measured * 1e6:6.0f} us  {floor * 1e6:8.0f} us  {measured / floor:6.2f}x"
            f"  {loaded * 1e6:11.0f} us  {measured / loaded:13.2f}x"
        )
    print()
    print("wake-ups of a finished collective's members (median per call, modes alternating)")
    print("ranks  one at a time  all at once  all-at-once / one-at-a-time")
    for n in sizes:
        calls = 300 if n <= 8 else 60
        times: dict[bool, list[float]] = {True: [], False: []}
        try:
            for _ in range(args.repeats):
                for deferred in (True, False):
                    Scheduler.defer_wakeups = deferred
                    times[deferred].append(max(simdist.run(_latency, world_size=n, args=(calls,))))
        finally:
            Scheduler.defer_wakeups = True
        one, every = statistics.median(times[True]), statistics.median(times[False])
        print(f"{n:5d}  {one * 1e6:10.0f} us  {every * 1e6:8.0f} us  {every / one:14.2f}x")
    print()
    print("'ring with work' passes the baton through n threads that each first spend one call's")
    print("CPU (measured above) in Python: the cost of any thread-per-rank simulator whose ranks")
    print("run that much Python per call under one GIL.")


if __name__ == "__main__":
    main()
