"""What the engine does for one collective, counted (not timed).

Wall-clock figures on a shared machine are noise; these counts are not. For
each case it prints, per collective call (or per whole run for an empty world):

* calls: Python and builtin function calls in the threads that make the
  call, as cProfile counts them (its ``callcount`` totals, one profiler per
  thread);
* lines: line events of ``sys.settrace`` in the same threads (a loop inside
  a comprehension is one call but many lines: this column shows O(world)
  scans that the call count hides);
* wake-ups: ``Condition.notify``/``notify_all``, ``Event.set``, ``Latch.set`` and simdist's
  own parker releases and hold wake-ups, counted by wrapping them (in the
  same threads; every thread for an empty world);
* swap: per-rank state slots read, written or copied at run-token switches
  (``RankStates``), and the fingerprints read to decide what to skip;
* walks: exact deadlock-check graph walks (``cannot_complete_threads``) and
  wait-for graphs built (``_graph_from_locked``).

Each per-call figure is the difference between a window of ``2K`` calls and
one of ``K`` calls, divided by ``K``: what the first and last call of a
window cost apart cancels, so the figure is exact and the same on every run.

Cases: a 2-rank all_reduce (ranks 0 and 1, a tp=2 group) in worlds of 2 to
1024 ranks, the other ranks either returned or waiting in a barrier; a small
all_reduce on the whole world; an empty world's start and teardown (every
thread counted, the second run of the process: parked threads reused).

``--before REV`` runs the same cases on simdist as of git revision REV
(exported with ``git archive``) and prints both side by side. Prints, never
asserts (tests/core/test_engine_counts.py asserts what must hold).

    python benchmarks/engine_calls.py
    python benchmarks/engine_calls.py --before main --quick
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _harness import ROOT, ChildFailed, child_json, exported, table

# --------------------------------------------------------------------------- #
# Counting, in the child process.
# --------------------------------------------------------------------------- #

_counts: Counter[str] = Counter()  # every thread's (an empty world's start and teardown)
_counts_lock = threading.Lock()
_every_thread = False
# Else only threads inside a window count, each its own share: other threads'
# clean-up runs when the OS lets it, so counting it would make the figure timing's.
_own = threading.local()


def _count(key: str) -> None:
    if _every_thread:
        with _counts_lock:
            _counts[key] += 1
    elif getattr(_own, "counts", None) is not None:
        _own.counts[key] += 1


def _wrap(owner: Any, name: str, key: str) -> None:
    """Count each call of ``owner.name`` under ``key`` (skipped when it does not exist)."""
    original = getattr(owner, name, None)
    if original is None:
        return

    def counted(*args: Any, **kwargs: Any) -> Any:
        _count(key)
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def _wrap_slot_init(slot_class: Any) -> None:
    """Every state slot made from now on counts its reads, writes, copies, fingerprints."""
    init = slot_class.__init__

    def counting(fn: Callable[..., Any] | None, key: str) -> Callable[..., Any] | None:
        if fn is None:
            return None

        def counted(*args: Any) -> Any:
            _count(key)
            return fn(*args)

        return counted

    def __init__(
        self: Any, name: str, get: Any, set_: Any, copy_: Any, fingerprint: Any = None, **kw: Any
    ) -> None:
        init(
            self,
            name,
            counting(get, "swap.read"),
            counting(set_, "swap.write"),
            counting(copy_, "swap.copy"),
            counting(fingerprint, "swap.fingerprint"),
            **kw,
        )

    slot_class.__init__ = __init__


def instrument() -> None:
    """Wrap what the wake-up, swap and deadlock columns count (before any run)."""
    from simdist._core import deadlock, slots
    from simdist._isolation import hold, rank_state
    from simdist._isolation import slots as state_slots

    _wrap(threading.Condition, "notify", "wake.notify")
    _wrap(threading.Condition, "notify_all", "wake.notify_all")
    _wrap(threading.Event, "set", "wake.event_set")
    _wrap(slots.Parker, "unpark", "wake.unpark")
    _wrap(hold, "_wake", "wake.hold")
    _wrap_slot_init(state_slots._Slot)
    _wrap(rank_state.RankStates, "switch_to", "swap.switch_to")
    _wrap(deadlock, "cannot_complete_threads", "walk.exact")
    _wrap(deadlock.Detector, "_graph_from_locked", "walk.graph")
    _wrap(deadlock.Detector, "settle_locked", "walk.settle")


class ThreadCounts:
    """cProfile call counts and settrace line counts of the calling thread, in windows."""

    def __init__(self) -> None:
        self.lines = 0
        self.wrapped: Counter[str] = Counter()  # the last "wrapped" window's counts

    def _trace(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._trace

    def window(self, mode: str, body: Callable[[], None]) -> int:
        """Run ``body`` counted: its calls (``mode`` "calls") or lines ("lines")."""
        if mode == "calls":
            profiler = cProfile.Profile()
            profiler.enable()
            try:
                body()
            finally:
                profiler.disable()
            return sum(entry.callcount for entry in profiler.getstats())
        if mode == "lines":
            self.lines = 0
            sys.settrace(self._trace)
            try:
                body()
            finally:
                sys.settrace(None)
            return self.lines
        _own.counts = Counter()
        try:
            body()
        finally:
            self.wrapped, _own.counts = _own.counts, None
        return 0


def _window_counts(mode: str, k: int, loop: Callable[[int], None]) -> dict[str, int]:
    """The counts of a window of ``2k`` calls minus those of a window of ``k``
    calls, in the calling thread (each thread in a window counts its own share
    of the wrapped counters)."""
    counter = ThreadCounts()
    if mode == "wrapped":
        counter.window(mode, lambda: loop(k))
        small = counter.wrapped
        counter.window(mode, lambda: loop(2 * k))
        large = counter.wrapped
        return {key: large[key] - small[key] for key in set(small) | set(large)}
    small = counter.window(mode, lambda: loop(k))
    large = counter.window(mode, lambda: loop(2 * k))
    return {mode: large - small}


def _all_reduces(group: Any) -> Callable[[int], None]:
    import torch
    import torch.distributed as dist

    t = torch.ones(8)

    def loop(n: int) -> None:
        for _ in range(n):
            dist.all_reduce(t, group=group)

    return loop


def pair_body(ctx: Any, mode: str, k: int, others: str) -> dict[str, int] | None:
    """Ranks 0 and 1 call ``2 * 3k`` all_reduces on their tp group, counted;
    the others return at once or wait in a barrier."""
    import torch.distributed as dist

    out = None
    if ctx.rank < 2:
        loop = _all_reduces(ctx.groups.tp)
        loop(5)  # warm: first-call caches
        out = _window_counts(mode, k, loop)
    if others == "barrier":
        dist.barrier()
    return out


def world_body(ctx: Any, mode: str, k: int) -> dict[str, int] | None:
    """Every rank calls all_reduce on the world group, counted."""
    loop = _all_reduces(None)
    loop(5)
    return _window_counts(mode, k, loop)


def _sum(results: list[dict[str, int] | None]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for r in results:
        if r is not None:
            total.update(r)
    return dict(total)


def child_pair(mode: str, world: int, k: int, others: str) -> dict[str, Any]:
    import simdist

    layout = simdist.Layout(tp=2, dp=world // 2)
    results = simdist.run(pair_body, layout=layout, args=(mode, k, others), timeout=900)
    return {key: value / k for key, value in _sum(results).items()}


def child_world(mode: str, world: int, k: int) -> dict[str, Any]:
    import simdist

    results = simdist.run(world_body, world_size=world, args=(mode, k), timeout=900)
    return {key: value / k for key, value in _sum(results).items()}


def empty_body(ctx: Any) -> int:
    return int(ctx.rank)


def _settled() -> None:
    """Wait until every rank thread of the last run is parked or gone (they
    count nothing once parked: hooks are cleared before parking)."""
    from simdist._core import pool

    deadline = time.monotonic() + 30
    last = -1
    while time.monotonic() < deadline:
        now = pool.idle_count()
        if now == last:
            return
        last = now
        time.sleep(0.2)


def child_start(mode: str, world: int) -> dict[str, Any]:
    """One empty world, every thread counted (after an unmeasured warm-up run)."""
    import simdist

    simdist.run(empty_body, world_size=world, timeout=900)
    _settled()
    profilers: list[cProfile.Profile] = []
    tracers: list[ThreadCounts] = []
    lock = threading.Lock()

    def boot_profile(frame: Any, event: str, arg: Any) -> None:
        profiler = cProfile.Profile()
        with lock:
            profilers.append(profiler)
        profiler.enable()

    def boot_trace(frame: Any, event: str, arg: Any) -> Any:
        counter = ThreadCounts()
        with lock:
            tracers.append(counter)
        sys.settrace(counter._trace)
        return counter._trace(frame, event, arg)

    global _every_thread
    _every_thread = mode == "wrapped"
    before = Counter(_counts)
    if mode == "calls":
        threading.setprofile(boot_profile)
        boot_profile(None, "call", None)
    elif mode == "lines":
        threading.settrace(boot_trace)
        boot_trace(sys._getframe(), "call", None)
    try:
        simdist.run(empty_body, world_size=world, timeout=900)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]  # None removes it
        threading.settrace(None)  # type: ignore[arg-type]
        sys.setprofile(None)
        sys.settrace(None)
    _settled()
    if mode == "calls":
        return {"calls": sum(e.callcount for p in profilers for e in p.getstats())}
    if mode == "lines":
        return {"lines": sum(t.lines for t in tracers)}
    after = Counter(_counts)
    return {key: after[key] - before[key] for key in set(after) | set(before)}


def child(kind: str, mode: str, *args: str) -> dict[str, Any]:
    # A collection inside a window would count finalizers' calls: not the engine's.
    gc.disable()
    if mode == "wrapped":
        instrument()
    if kind == "pair":
        world, k, others = int(args[0]), int(args[1]), args[2]
        return child_pair(mode, world, k, others)
    if kind == "world":
        return child_world(mode, int(args[0]), int(args[1]))
    return child_start(mode, int(args[0]))


# --------------------------------------------------------------------------- #
# The parent: each case in a fresh child per revision and mode, one table.
# --------------------------------------------------------------------------- #

MODES = ("calls", "lines", "wrapped")


def measure(root: Path, kind: str, *args: object, timeout: float) -> dict[str, Any]:
    """Every mode of one case against the simdist under ``root``, merged."""
    merged: dict[str, Any] = {}
    for mode in MODES:
        try:
            merged.update(child_json(__file__, ["--child", kind, mode, *args], path=[root], timeout=timeout))
        except ChildFailed as exc:
            return {"error": f"{mode}: {exc}"}
    return merged


def _n(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 0.05 else f"{x:.1f}"


def cells(r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [f"({r['error']})", "", "", "", ""]
    wake = sum(v for k, v in r.items() if k.startswith("wake."))
    swap = sum(r.get(f"swap.{k}", 0) for k in ("read", "write", "copy"))
    return [
        _n(r.get("calls", 0)),
        _n(r.get("lines", 0)),
        _n(wake),
        f"{_n(swap)} (+{_n(r.get('swap.fingerprint', 0))} fp)",
        f"{_n(r.get('walk.exact', 0))} / {_n(r.get('walk.graph', 0))}",
    ]


def cases(quick: bool) -> list[tuple[str, str, tuple[object, ...]]]:
    k = 10 if quick else 20
    pair_worlds = (2, 4, 8, 16, 64, 1024)
    out: list[tuple[str, str, tuple[object, ...]]] = []
    for others in ("returned", "barrier"):
        for n in pair_worlds:
            if others == "barrier" and n == 2:
                continue  # no other rank
            out.append((f"2-rank all_reduce, world {n}, others {others}", "pair", (n, k, others)))
    for n in (2, 4, 8, 16) + (() if quick else (64,)):
        out.append((f"all_reduce on the world, {n} ranks", "world", (n, k)))
    for n in (2, 8, 64) + (() if quick else (1024,)):
        out.append((f"empty world start + teardown, {n} ranks (per run)", "start", (n,)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--before", metavar="REV", help="also count simdist as of this git revision")
    parser.add_argument("--quick", action="store_true", help="fewer calls per window, fewer cases")
    parser.add_argument(
        "--only", metavar="TEXT[|TEXT...]", help="only the cases whose label contains one of these texts"
    )
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(*opts.child)))
        return
    headers = ["case, simdist", "calls", "lines", "wake-ups", "swap objects", "walks exact / graphs"]
    print("Engine work per collective call (whole run for an empty world), counted; deterministic\n")
    with ExitStack() as stack:
        roots = {"now": ROOT}
        if opts.before:
            roots[f"before ({opts.before})"] = stack.enter_context(exported(opts.before, "simdist"))
        rows = []
        for label, kind, args in cases(opts.quick):
            if opts.only and not any(text in label for text in opts.only.split("|")):
                continue
            for name, root in roots.items():
                rows.append([f"{label}, {name}", *cells(measure(root, kind, *args, timeout=900))])
    table(headers, rows)
    print()


if __name__ == "__main__":
    main()
