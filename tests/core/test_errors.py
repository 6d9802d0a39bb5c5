"""A rank that raises ends ``run`` with one RankError naming it.

The failing rank's own exception is the cause; peers woken out of a wait are
reported as released, not as failures; no thread outlives ``run``; the next run
in the same process works. ``timeout=`` only stops a broken implementation from
hanging the suite: nothing here measures time.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout

TIMEOUT = 60.0


class Boom(Exception):
    """The exception a test body raises on purpose."""


@pytest.fixture
def clean_world() -> Iterator[None]:
    """Every test here must leave no thread, no initialised default group, and a
    simulator that still runs."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], f"threads left running after the failed run: {left}"
    assert not dist.is_initialized()
    assert simdist.run(sum_ranks, world_size=3, timeout=TIMEOUT) == [3.0, 3.0, 3.0]


def sum_ranks(ctx: simdist.RankContext) -> float:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return t.item()


def run_expecting_rank_error(
    body: Callable[..., Any], raised: dict[int, BaseException], **run_kwargs: Any
) -> simdist.RankError:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            body,
            timeout=TIMEOUT,
            kwargs={"raised": raised},
            share_args=True,  # ranks fill it in
            **run_kwargs,
        )
    err = info.value
    assert isinstance(err, simdist.SimulationError)
    return err


def assert_names(err: simdist.RankError, rank: int) -> None:
    assert re.search(rf"\brank {rank}\b", str(err)), f"message does not name rank {rank}:\n{err}"


def fail(ctx: simdist.RankContext, raised: dict[int, BaseException], what: str) -> None:
    exc = Boom(f"{what} on rank {ctx.rank}")
    raised[ctx.rank] = exc
    raise exc


# --- before, during and after collectives ----------------------------------------------


def fails_before(ctx: simdist.RankContext, raised: dict[int, BaseException], culprit: int) -> None:
    if ctx.rank == culprit:
        fail(ctx, raised, "before any collective")
    sum_ranks(ctx)  # peers wait here for a rank that never comes


def fails_between(ctx: simdist.RankContext, raised: dict[int, BaseException], culprit: int) -> None:
    sum_ranks(ctx)
    t = torch.ones(2)
    dist.broadcast(t, src=0)
    if ctx.rank == culprit:
        fail(ctx, raised, "between collectives")
    dist.barrier()


def fails_after(ctx: simdist.RankContext, raised: dict[int, BaseException], culprit: int) -> float:
    value = sum_ranks(ctx)
    dist.barrier()
    if ctx.rank == culprit:
        fail(ctx, raised, "after every collective")
    return value


WORLDS = [
    pytest.param({"world_size": 2}, id="flat2"),
    pytest.param({"world_size": 3}, id="flat3"),
    pytest.param({"layout": Layout(tp=2, dp=2, pp=2)}, id="tp2dp2pp2"),
]


def world_size_of(run_kwargs: dict[str, Any]) -> int:
    return run_kwargs["layout"].world_size if "layout" in run_kwargs else run_kwargs["world_size"]


@pytest.mark.parametrize("run_kwargs", WORLDS)
@pytest.mark.parametrize("where", [fails_before, fails_between], ids=["before", "between"])
@pytest.mark.parametrize("position", ["first", "last"])
def test_failure_while_peers_wait(
    clean_world: None, where: Callable[..., Any], position: str, run_kwargs: dict[str, Any]
) -> None:
    n = world_size_of(run_kwargs)
    culprit = 0 if position == "first" else n - 1
    raised: dict[int, BaseException] = {}
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            where,
            timeout=TIMEOUT,
            kwargs={"raised": raised, "culprit": culprit},
            share_args=True,
            **run_kwargs,
        )
    err = info.value
    assert err.__cause__ is raised[culprit]
    assert set(err.failures) == {culprit}
    assert err.failures[culprit] is raised[culprit]
    assert err.ranks == (culprit,)
    # Every other rank was stuck in (or on its way into) a collective needing the culprit.
    assert sorted(err.released) == [r for r in range(n) if r != culprit]
    assert_names(err, culprit)


@pytest.mark.parametrize("run_kwargs", WORLDS)
def test_failure_after_collectives_has_no_released_peers(
    clean_world: None, run_kwargs: dict[str, Any]
) -> None:
    n = world_size_of(run_kwargs)
    raised: dict[int, BaseException] = {}
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            fails_after,
            timeout=TIMEOUT,
            kwargs={"raised": raised, "culprit": n - 1},
            share_args=True,
            **run_kwargs,
        )
    err = info.value
    assert err.__cause__ is raised[n - 1]
    assert set(err.failures) == {n - 1}
    assert tuple(err.released) == ()  # the others finished normally
    assert_names(err, n - 1)


# --- failures inside subgroups, point to point, async waits, backward --------------------


def fails_in_tp_group(ctx: simdist.RankContext, raised: dict[int, BaseException]) -> None:
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.groups.dp)
    if ctx.rank == 3:
        fail(ctx, raised, "inside a tp step")
    dist.all_reduce(t, group=ctx.groups.tp)  # rank 3's tp peer blocks here
    dist.all_reduce(t, group=ctx.groups.pp)  # others get this far, then wait on the world
    dist.barrier()


def test_failure_inside_a_subgroup_releases_everyone(clean_world: None) -> None:
    raised: dict[int, BaseException] = {}
    err = run_expecting_rank_error(fails_in_tp_group, raised, layout=Layout(tp=2, dp=2, pp=2))
    assert err.__cause__ is raised[3]
    assert set(err.failures) == {3}
    assert sorted(err.released) == [0, 1, 2, 4, 5, 6, 7]
    assert_names(err, 3)


def fails_before_send(ctx: simdist.RankContext, raised: dict[int, BaseException], asynchronous: bool) -> None:
    buf = torch.empty(3)
    if ctx.rank == 0:
        if asynchronous:
            work = dist.irecv(buf, src=1)
            work.wait()
        else:
            dist.recv(buf, src=1)
    else:
        fail(ctx, raised, "before its send")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["recv", "irecv_wait"])
def test_failure_releases_a_peer_waiting_to_receive(clean_world: None, asynchronous: bool) -> None:
    raised: dict[int, BaseException] = {}
    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            fails_before_send,
            world_size=2,
            timeout=TIMEOUT,
            kwargs={"raised": raised, "asynchronous": asynchronous},
            share_args=True,
        )
    err = info.value
    assert err.__cause__ is raised[1]
    assert set(err.failures) == {1}
    assert tuple(err.released) == (0,)


def fails_while_async_pending(ctx: simdist.RankContext, raised: dict[int, BaseException]) -> None:
    if ctx.rank == 2:
        fail(ctx, raised, "with no all_reduce issued")
    t = torch.ones(4)
    work = dist.all_reduce(t, async_op=True)  # the culprit never joins this one
    work.wait()


def test_failure_releases_peers_waiting_on_async_work(clean_world: None) -> None:
    raised: dict[int, BaseException] = {}
    err = run_expecting_rank_error(fails_while_async_pending, raised, world_size=4)
    assert set(err.failures) == {2} and err.__cause__ is raised[2]
    assert sorted(err.released) == [0, 1, 3]


class FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(fctx: Any, x: torch.Tensor, fail_here: bool) -> torch.Tensor:
        fctx.fail_here = fail_here
        return x.clone()

    @staticmethod
    def backward(fctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if fctx.fail_here:
            raise Boom("inside backward")
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad, None


def fails_in_backward(ctx: simdist.RankContext, raised: dict[int, BaseException]) -> None:
    x = torch.ones(3, requires_grad=True)
    FailingBackward.apply(x, ctx.rank == 1).sum().backward()


def test_failure_inside_autograd_backward(clean_world: None) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(fails_in_backward, world_size=3, timeout=TIMEOUT, kwargs={"raised": {}})
    err = info.value
    assert set(err.failures) == {1}
    # autograd may wrap what backward raised; the original must be in the chain.
    chain, exc = [], err.__cause__
    while exc is not None and len(chain) < 10:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert any(isinstance(e, Boom) and "inside backward" in str(e) for e in chain), chain
    assert sorted(err.released) == [0, 2]


# --- several failures, and exits without the collective --------------------------------


def two_fail(ctx: simdist.RankContext, raised: dict[int, BaseException]) -> None:
    if ctx.rank in (0, 2):
        fail(ctx, raised, "independently")
    sum_ranks(ctx)


def test_independent_failures_are_all_reported(clean_world: None) -> None:
    raised: dict[int, BaseException] = {}
    err = run_expecting_rank_error(two_fail, raised, world_size=4)
    assert set(err.failures) == {0, 2}
    assert err.failures[0] is raised[0] and err.failures[2] is raised[2]
    assert err.__cause__ in (raised[0], raised[2])  # which came first is up to the scheduler
    assert sorted(err.released) == [1, 3]
    assert_names(err, 0)
    assert_names(err, 2)


def leaves_early(ctx: simdist.RankContext) -> None:
    if ctx.rank != 1:
        dist.barrier()  # rank 1 returned instead of joining: this can never complete


def test_rank_returning_without_joining_is_a_deadlock(clean_world: None) -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(leaves_early, world_size=3, timeout=TIMEOUT)
    assert isinstance(info.value, simdist.SimulationError)


def same_invalid_call_everywhere(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        # Arrive last, so a peer's failure is already known when this rank calls.
        time.sleep(0.02)
    dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND)  # BAND is undefined on float


def test_an_invalid_call_made_by_every_rank_fails_every_rank(clean_world: None) -> None:
    """Each rank's own call is invalid, so each rank is a failure in its own right,
    whatever the order the threads got there in; none was merely released."""
    with pytest.raises(simdist.RankError) as info:
        simdist.run(same_invalid_call_everywhere, world_size=3, timeout=TIMEOUT)
    err = info.value
    assert sorted(err.failures) == [0, 1, 2], f"failures {sorted(err.failures)}, released {err.released}"
    assert tuple(err.released) == ()
    for exc in err.failures.values():
        assert "BAND" in str(exc)
