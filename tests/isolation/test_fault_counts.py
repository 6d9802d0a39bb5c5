"""A fault rule's nth call is counted per rank across all of the rank's
threads: its helper threads and pool workers check faults alongside its main
thread (they do not take the run token), so no count may be lost between them.

The reference is arithmetic: N calls made in all, the rule's nth is the Nth.
On the old code the counts raced (read, add one, write back, unlocked) and
under frequent thread switches the rule fired late or never.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from simdist.faults import FaultPlan, FaultState

THREADS = 8
CALLS = 4000


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_a_rules_nth_call_made_from_many_threads_of_one_rank_fires_exactly_once(
    frequent_switches: None,
) -> None:
    total = THREADS * CALLS
    state = FaultState(FaultPlan.delay(0, 0.0, op="all_reduce", nth=total), None, 2)
    group = SimpleNamespace(label="world", axes=("world",), describe=lambda: "world [0, 1]")
    fired: list[int] = []
    made = [0] * THREADS
    go = threading.Event()

    def worker(k: int) -> None:
        go.wait(30)
        for _ in range(CALLS):
            made[k] += 1
            if state.due(0, "all_reduce", group, -1):
                fired.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(120)
    assert sum(made) == total
    assert len(fired) == 1, f"the rule fired {len(fired)} time(s) in {total} calls"
    assert state.due(0, "all_reduce", group, -1) == []  # past its nth: never again
