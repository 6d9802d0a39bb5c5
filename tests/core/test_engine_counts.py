"""What one collective costs the engine does not grow with the world: counted, not timed.

cProfile counts every Python and builtin call of the threads that make the
calls; a window of ``2k`` calls minus a window of ``k`` calls, over ``k``,
is what one call costs, exactly (the windows' edges cancel), so these
figures are the same on every run and every machine. benchmarks/engine_calls.py
prints them, with wake-ups, state swaps and deadlock walks, for more worlds.
"""

from __future__ import annotations

import cProfile
import gc
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._core import affinity, slots
from simdist._isolation import hold, rank_state

K = 4


@pytest.fixture(autouse=True)
def _pins_as_on_an_idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a run pins its handoffs depends on the machine's load at its
    start (affinity._machine_busy); the counts must not."""
    monkeypatch.setattr(affinity, "_machine_busy", lambda: False)


@pytest.fixture(autouse=True)
def _no_collector() -> Iterator[None]:
    """A garbage collection inside a window runs finalizers and weakref
    callbacks left by earlier tests: calls that are not the engine's."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _calls(body: Callable[[], None]) -> int:
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        body()
    finally:
        profiler.disable()
    return sum(entry.callcount for entry in profiler.getstats())


def _per_call(group: Any) -> int:
    t = torch.ones(8)

    def loop(n: int) -> None:
        for _ in range(n):
            dist.all_reduce(t, group=group)

    loop(3)  # first-call caches
    small = _calls(lambda: loop(K))
    return _calls(lambda: loop(2 * K)) - small


def _pair_body(ctx: Any, others: str) -> int | None:
    out = _per_call(ctx.groups.tp) if ctx.rank < 2 else None
    if others == "barrier":
        dist.barrier()
    return out


def pair_calls(world: int, others: str) -> float:
    """Calls per 2-rank all_reduce (both ranks together) in a world of ``world``."""
    results = simdist.run(_pair_body, layout=simdist.Layout(tp=2, dp=world // 2), args=(others,), timeout=300)
    return sum(r for r in results if r is not None) / K


def _world_body(ctx: Any) -> int:
    return _per_call(None)


def world_calls_per_rank(world: int) -> float:
    """Calls per rank of one all_reduce on the whole world."""
    return sum(simdist.run(_world_body, world_size=world, timeout=300)) / K / world


def test_counts_are_deterministic() -> None:
    assert pair_calls(8, "returned") == pair_calls(8, "returned")
    assert world_calls_per_rank(8) == world_calls_per_rank(8)


def test_two_rank_collective_costs_the_same_in_a_1024_rank_world() -> None:
    small = pair_calls(8, "returned")
    assert pair_calls(1024, "returned") <= small + 4, "others returned"
    assert pair_calls(1024, "barrier") <= pair_calls(8, "barrier") + 4, "others waiting in a barrier"


def test_a_world_collective_costs_each_rank_the_same_at_32_and_256_ranks() -> None:
    # What may grow: the share of ranks that take the token over ((n-1)/n of
    # one switch each) and the run token's queue, a heap (O(log n) a switch).
    # What may not: any scan of the members per rank (it was O(world)).
    small, large = world_calls_per_rank(32), world_calls_per_rank(256)
    assert large <= small + 16, (small, large)


def _wakeups_body(ctx: Any, counts: threading.local) -> int | None:
    if ctx.rank >= 2:
        return None
    t = torch.ones(8)
    group = ctx.groups.tp

    def window(n: int) -> int:
        counts.n = 0
        for _ in range(n):
            dist.all_reduce(t, group=group)
        woken, counts.n = counts.n, None
        return int(woken)

    window(3)
    small = window(K)
    return window(2 * K) - small


def test_a_switch_wakes_exactly_the_next_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2-rank all_reduce hands the run token over once: one thread woken,
    no broadcast, no spare wake-up of the process hold's waiters (there are none)."""
    counts = threading.local()

    def counting(original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if getattr(counts, "n", None) is not None:
                counts.n += 1
            return original(*args, **kwargs)

        return counted

    for owner, name in [
        (slots.Parker, "unpark"),
        (hold, "_wake"),
        (threading.Condition, "notify"),
        (threading.Condition, "notify_all"),
        (threading.Event, "set"),
    ]:
        monkeypatch.setattr(owner, name, counting(getattr(owner, name)))
    for world in (8, 1024):
        results = simdist.run(
            _wakeups_body, layout=simdist.Layout(tp=2, dp=world // 2), args=(counts,), share_args=True
        )
        assert sum(r for r in results if r is not None) / K == 1.0, world


# This revision's counts (benchmarks/engine_calls.py prints them, with the
# revision before): a change that makes them half as large again fails here,
# which is well short of the doubling this pin is meant to catch.
PAIR_CALLS_WORLD_8 = 241  # both members of one 2-rank all_reduce
WORLD_CALLS_PER_RANK_8 = 134.125  # one rank's share of an all_reduce on 8 ranks
MARGIN = 1.5


_FRESH_COUNTS = """
import gc, json, sys
sys.path.insert(0, sys.argv[1])
import test_engine_counts as t
t.affinity._machine_busy = lambda: False
gc.collect()
gc.disable()
print(json.dumps([t.pair_calls(8, "returned"), t.world_calls_per_rank(8)]))
"""


def test_a_collective_costs_at_most_half_again_its_pinned_count() -> None:
    """Counted in a fresh interpreter: what earlier tests imported (DTensor,
    Megatron) adds state slots, and so calls, to every switch."""
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_COUNTS, str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    pair, world = json.loads(proc.stdout.strip().splitlines()[-1])
    assert pair <= MARGIN * PAIR_CALLS_WORLD_8, pair
    assert world <= MARGIN * WORLD_CALLS_PER_RANK_8, world


def _swap_body(ctx: Any, draw: bool) -> None:
    t = torch.ones(8)
    for _ in range(2 * K):
        if draw:
            torch.rand(1)
        dist.all_reduce(t)


def _generator_access(monkeypatch: pytest.MonkeyPatch, draw: bool) -> Counter[str]:
    """Reads and writes of torch's CPU generator at switches, over a 2-rank run
    of ``2K`` all_reduces (each rank drawing before each call, or never)."""
    counts: Counter[str] = Counter()
    original = rank_state._builtin_slots

    def counted_slots() -> list[Any]:
        slots = original()
        for slot in slots:
            if slot.name == "torch default generator":
                get, set_ = slot.get, slot.set
                slot.get = lambda get=get: (counts.update(["read"]), get())[1]
                slot.set = lambda value, set_=set_: (counts.update(["write"]), set_(value))[1]
        return slots

    monkeypatch.setattr(rank_state, "_builtin_slots", counted_slots)
    simdist.run(_swap_body, world_size=2, args=(draw,), timeout=300)
    return counts


def test_a_switch_reads_and_writes_the_cpu_generator_only_when_a_rank_drew(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lazy swap: ranks that never draw share the caller's state, so no
    switch touches the generator beyond its in-place fingerprint (the one
    read is the caller's state, at run start, and the run's end finds
    nothing to put back); ranks that draw are read at every switch and written,
    each having its own state."""
    torch.manual_seed(20261202)  # a state no run has seen: read once
    assert _generator_access(monkeypatch, draw=False) == Counter(read=1)
    assert _generator_access(monkeypatch, draw=False) == Counter(read=1)  # each run reads the caller's
    drawn = _generator_access(monkeypatch, draw=True)
    assert drawn["read"] >= 2 * K and drawn["write"] >= 2 * K, drawn
