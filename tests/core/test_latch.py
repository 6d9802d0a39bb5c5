"""The engine's one-way flag behaves as ``threading.Event`` does for set/is_set/wait."""

from __future__ import annotations

import threading
import time

import pytest

from simdist._core.latch import Latch


def test_wait_times_out_false_until_set_then_true_at_once() -> None:
    latch = Latch()
    assert not latch.is_set()
    assert latch.wait(0.01) is False
    assert latch.wait(0) is False
    assert latch.wait(-1.0) is False  # Event.wait takes a negative timeout as "do not wait"
    latch.set()
    assert latch.is_set()
    assert latch.wait() is True
    assert latch.wait(0) is True
    latch.set()  # a second set changes nothing and does not raise
    assert latch.wait(0.01) is True


@pytest.mark.parametrize("setters", [1, 4])
def test_every_waiter_passes_once_set_however_many_set_it(setters: int) -> None:
    latch = Latch()
    seen: list[bool] = []
    lock = threading.Lock()

    def waiter() -> None:
        got = latch.wait(10.0)
        with lock:
            seen.append(got)

    waiters = [threading.Thread(target=waiter) for _ in range(8)]
    for t in waiters:
        t.start()
    time.sleep(0.02)  # most of them are blocked in wait by now
    barrier = threading.Barrier(setters)

    def setter() -> None:
        barrier.wait()
        latch.set()

    ts = [threading.Thread(target=setter) for _ in range(setters)]
    for t in ts:
        t.start()
    for t in ts + waiters:
        t.join(10.0)
    assert seen == [True] * 8
    # Still set, and a later waiter passes too.
    assert latch.wait(0) is True


def test_a_huge_timeout_is_accepted_as_event_accepts_it() -> None:
    latch = Latch()
    threading.Timer(0.01, latch.set).start()
    assert latch.wait(1e12) is True
