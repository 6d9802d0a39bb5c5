"""When a wait with a timeout that can never complete raises its error.

gloo raises once the timeout has passed in wall time; simdist knows at once
that the wait can never complete, and by default raises at once. With
``timeouts.waited_out_up_to_s`` set (``simdist.torch_compat`` sets it to
``REAL_TIME_UP_TO_S``), a short timeout is waited out first, from where
gloo's clock starts, so code that measures it sees gloo's behaviour
(PyTorch's ``test_barrier_timeout_*`` assert that the time passed); a long
one is still raised at once. Only lower bounds on wall time are asserted (a sleep guarantees
them); what is not waited is shown by the scheduler's sleep never being asked.
"""

from __future__ import annotations

import time
import warnings
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._backend import timeouts
from simdist._core.scheduler import Scheduler as Waiting

TIMEOUT = 60.0


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every sleep a rank asks the scheduler for (a timeout waited out)."""
    asked: list[float] = []
    original = Waiting.sleep

    def recording(self: Any, seconds: float) -> None:
        asked.append(seconds)
        original(self, seconds)

    monkeypatch.setattr(Waiting, "sleep", recording)
    return asked


@pytest.fixture
def waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short timeouts waited out, as under simdist.torch_compat."""
    monkeypatch.setattr(timeouts, "waited_out_up_to_s", timeouts.REAL_TIME_UP_TO_S)


def _elapsed_and_error(fn: Any) -> tuple[float, str]:
    start = time.monotonic()
    try:
        fn()
    except RuntimeError as exc:
        return time.monotonic() - start, str(exc)
    return time.monotonic() - start, "ok"


def short_timeouts_body(ctx: Any) -> dict[str, tuple[float, str]] | None:
    timed = dist.new_group(timeout=timedelta(seconds=0.5))
    generous = dist.new_group(timeout=timedelta(seconds=300))
    monitored = dist.new_group(backend="gloo")
    other = dist.new_group()
    if ctx.rank == 2:
        return None  # joins none of rank 0's calls
    out = {}
    if ctx.rank == 0:
        out["group"] = _elapsed_and_error(lambda: dist.barrier(group=timed))
        out["barrier arg"] = _elapsed_and_error(
            lambda: dist.barrier(group=generous, timeout=timedelta(seconds=0.3))
        )
        work = dist.all_reduce(torch.ones(1), group=other, async_op=True)
        out["work.wait"] = _elapsed_and_error(lambda: work.wait(timeout=timedelta(seconds=0.4)))
    out["monitored"] = _elapsed_and_error(
        lambda: dist.monitored_barrier(monitored, timeout=timedelta(seconds=0.6))
    )
    return out


def test_by_default_even_a_short_timeout_is_raised_at_once(sleeps: list[float]) -> None:
    got = simdist.run(short_timeouts_body, world_size=3, timeout=TIMEOUT)[0]
    assert got is not None
    assert "Timed out waiting 500ms" in got["group"][1] and "reported at once" in got["group"][1]
    assert "Operation timed out!" in got["work.wait"][1]
    assert sleeps == []


def test_a_short_timeout_is_waited_out_before_its_error(sleeps: list[float], waited_out: None) -> None:
    got = simdist.run(short_timeouts_body, world_size=3, timeout=TIMEOUT)
    assert sleeps  # what the other tests' empty lists mean: none was asked for
    first = got[0]
    assert first is not None
    for case, seconds, words in [
        ("group", 0.5, "Timed out waiting 500ms"),
        ("barrier arg", 0.3, "Timed out waiting 300ms"),
        ("work.wait", 0.4, "Operation timed out!"),
        ("monitored", 0.6, "Rank 2 failed to pass monitoredBarrier in 600 ms"),
    ]:
        elapsed, message = first[case]
        assert words in message, (case, message)
        assert elapsed >= seconds, (case, elapsed)
    # Rank 1 learns of rank 0's failure when rank 0 gives up: after its timeout.
    assert got[1] is not None and "successfully reached monitoredBarrier" in got[1]["monitored"][1]
    assert got[1]["monitored"][0] >= 0.6


def long_timeout_body(ctx: Any) -> str | None:
    timed = dist.new_group([0, 1], timeout=timedelta(seconds=timeouts.REAL_TIME_UP_TO_S + 55))
    if ctx.rank != 0:
        return None
    try:
        dist.barrier(group=timed)
    except RuntimeError as exc:
        return str(exc)
    return "ok"


def test_a_long_timeout_is_raised_at_once(sleeps: list[float], waited_out: None) -> None:
    got = simdist.run(long_timeout_body, world_size=2, timeout=TIMEOUT)[0]
    assert got is not None and "Timed out waiting 60000ms" in got
    assert sleeps == []


def issued_early_body(ctx: Any) -> str | None:
    timed = dist.new_group([0, 1], timeout=timedelta(seconds=0.2))
    if ctx.rank != 0:
        return None
    work = dist.barrier(group=timed, async_op=True)
    time.sleep(0.3)  # the transport's clock runs from the issue: the timeout is already over
    try:
        work.wait()
    except RuntimeError as exc:
        return str(exc)
    return "ok"


def test_a_group_timeout_counts_from_the_call_not_the_wait(sleeps: list[float], waited_out: None) -> None:
    got = simdist.run(issued_early_body, world_size=2, timeout=TIMEOUT)[0]
    assert got is not None and "Timed out waiting 200ms" in got
    assert sleeps == []


def gloo_elapsed_body(ctx: Any, linger: float) -> tuple[float, str] | None:
    timed = dist.new_group(timeout=timedelta(seconds=1))
    result = _elapsed_and_error(lambda: dist.barrier(group=timed)) if ctx.rank == 0 else None
    time.sleep(linger)  # on gloo a peer that exits closes the connection early
    return result


@pytest.mark.gloo
def test_the_time_a_timeout_takes_matches_a_gloo_world(waited_out: None) -> None:
    gloo = simdist.run_processes(gloo_elapsed_body, world_size=2, args=(3.0,), timeout=120.0)[0]
    sim = simdist.run(gloo_elapsed_body, world_size=2, args=(0.0,), timeout=TIMEOUT)[0]
    assert gloo is not None and sim is not None
    assert "Timed out waiting 1000ms" in gloo[1] and "Timed out waiting 1000ms" in sim[1]
    assert gloo[0] >= 1.0 - 0.1  # the reference: gloo's own clock (PyTorch allows 0.1 s early)
    assert sim[0] >= 1.0


def monitored_failing_body(ctx: Any) -> None:
    failing = dist.new_group(backend="gloo")
    passing = dist.new_group(backend="gloo")  # a failed barrier closes its group, as on gloo
    if ctx.rank != 2:
        try:
            dist.monitored_barrier(failing, timeout=timedelta(seconds=0.1))
        except RuntimeError:
            pass
    dist.monitored_barrier(passing, timeout=timedelta(seconds=30))


def test_monitored_barriers_own_messages_are_not_the_programs_to_wait_for() -> None:
    # Its sends and recvs are the backend's (gloo's are inside its C++ call):
    # the async sanitizer must not report them unwaited, failed or passed.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        simdist.run(monitored_failing_body, world_size=3, timeout=TIMEOUT)
    assert [str(w.message) for w in seen if w.category is simdist.UnwaitedWorkWarning] == []
