"""The sanitizer's rules one by one: what counts as a wait, what races, what does not, its options."""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import simdist
from simdist._run.options import OPTION_NAMES, RunOptions
from simdist._sanitizer.mode import SanitizerMode


def sanitizer_modes() -> list[object]:
    return [m for m in _get_current_dispatch_mode_stack() if isinstance(m, SanitizerMode)]


def raises_race(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(simdist.AsyncRaceError) as info:
        fn(*args)
    return str(info.value)


# -- the four reports -------------------------------------------------------


def test_a_read_of_an_all_reduce_in_flight_is_refused_on_every_rank_alike() -> None:
    def body(ctx: simdist.RankContext) -> str:
        t = torch.ones(4) * (ctx.rank + 1)
        work = dist.all_reduce(t, async_op=True)
        message = raises_race(t.clone)
        work.wait()
        assert t.tolist() == [3.0] * 4
        return message

    for rank, message in enumerate(simdist.run(body, world_size=2)):
        assert message.startswith(f"rank {rank}: aten.clone at ")
        assert "all_reduce on group world [0, 1] seq 0 (issued at " in message


def test_a_write_to_an_all_gather_input_in_flight_is_refused() -> None:
    def body(ctx: simdist.RankContext) -> list[float]:
        t = torch.full((2,), float(ctx.rank))
        outs = [torch.empty(2) for _ in range(2)]
        work = dist.all_gather(outs, t, async_op=True)
        assert "writes a buffer the call reads" in raises_race(t.mul_, 100)
        work.wait()
        return torch.cat(outs).tolist()

    assert simdist.run(body, world_size=2) == [[0.0, 0.0, 1.0, 1.0]] * 2


def test_isend_buffer_write_and_irecv_buffer_read_before_wait_are_refused() -> None:
    def body(ctx: simdist.RankContext) -> str:
        if ctx.rank == 0:
            t = torch.ones(4)
            work = dist.isend(t, 1)
            message = raises_race(t.fill_, 7.0)  # simdist copied the buffer; NCCL may not have
            work.wait()
            return message
        r = torch.zeros(4)
        work = dist.irecv(r, 0)
        message = raises_race(r.sum)
        work.wait()
        assert r.tolist() == [1.0] * 4
        return message

    send, recv = simdist.run(body, world_size=2)
    assert "isend to rank 1 (tag 0)" in send and "writes a buffer the call reads" in send
    assert "irecv from rank 0 (tag 0)" in recv and "reads a buffer the call writes" in recv


def test_a_work_never_waited_warns_with_its_call_site_and_strict_makes_it_an_error() -> None:
    def body(ctx: simdist.RankContext) -> torch.Tensor:
        t = torch.ones(2)
        dist.all_reduce(t, async_op=True)
        return t

    with pytest.warns(simdist.UnwaitedWorkWarning, match=r"never waited and the rank returned its buffers"):
        simdist.run(body, world_size=2)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, world_size=2, strict_async=True)
    assert isinstance(info.value.__cause__, simdist.AsyncRaceError)
    assert "test_sanitizer.py:" in str(info.value.__cause__)


@dataclasses.dataclass
class _Bucket:
    name: str
    grads: torch.Tensor


class _Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.state = {"buffer": t}


@pytest.mark.parametrize(
    "wrap",
    [lambda t: _Bucket("b", t), _Holder, lambda t: {frozenset({1}): [(t,)]}, lambda t: t.view(2, 1)],
    ids=["dataclass", "plain-object", "nested-containers", "view"],
)
def test_the_unwaited_warning_sees_the_buffer_however_the_result_holds_it(wrap: Any) -> None:
    def body(ctx: simdist.RankContext) -> Any:
        t = torch.ones(2)
        dist.all_reduce(t, async_op=True)
        return wrap(t)

    with pytest.warns(simdist.UnwaitedWorkWarning, match=r"never waited and the rank returned its buffers"):
        simdist.run(body, world_size=2)


# -- what ends a call's flight ------------------------------------------------------------


@pytest.mark.parametrize("how", ["wait", "future", "is_completed", "result"])
def test_each_kind_of_wait_ends_the_race(how: str) -> None:
    def body(ctx: simdist.RankContext) -> float:
        t = torch.ones(2)
        work = dist.all_reduce(t, async_op=True)
        if how == "wait":
            work.wait()
        elif how == "future":
            work.get_future().wait()
        elif how == "is_completed":
            dist.barrier()  # every member has joined: the call is complete
            assert work.is_completed()
        else:
            work.result()
        assert sanitizer_modes() == []  # nothing in flight: the mode is gone
        return t.sum().item()

    assert simdist.run(body, world_size=2) == [4.0, 4.0]


def test_functional_collectives_wait_through_wait_tensor_and_first_use() -> None:
    def body(ctx: simdist.RankContext) -> list[float]:
        t = torch.ones(2)
        a = funcol.all_reduce(t, "sum", dist.group.WORLD)
        first_use = (a * 1).sum().item()  # the AsyncCollectiveTensor waits
        b = funcol.wait_tensor(funcol.all_reduce(t, "sum", dist.group.WORLD))
        raw = torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name)
        message = raises_race(raw.sum)
        waited = torch.ops._c10d_functional.wait_tensor(raw)
        assert "all_reduce" in message
        return [first_use, b.sum().item(), waited.sum().item()]

    assert simdist.run(body, world_size=2) == [[4.0, 4.0, 4.0]] * 2


# -- what is not a race -----------------------------------------------------------------------


def test_synchronous_code_never_meets_the_mode() -> None:
    def body(ctx: simdist.RankContext) -> bool:
        t = torch.ones(2)
        dist.all_reduce(t)
        return sanitizer_modes() == [] and t.sum().item() == 4.0

    assert simdist.run(body, world_size=2) == [True, True]


def test_memory_the_call_does_not_cover_is_free_to_use() -> None:
    def body(ctx: simdist.RankContext) -> float:
        flat = torch.arange(8.0)
        middle = flat[2:4]
        work = dist.all_reduce(middle, async_op=True)
        flat[4:].mul_(10)  # next to the call's memory
        flat[::4].add_(100)  # elements 0 and 4: the address range spans the call's, no element does
        shape = torch.empty_like(middle)  # metadata only
        view = middle.view(1, 2)  # a view touches no data
        assert "reads" in raises_race(view.sum)  # ... but reading through it does
        assert "writes" in raises_race(flat[1:3].zero_)  # one shared element is enough
        work.wait()
        return float(flat.sum()) + shape.numel() * 0

    # 0+100, 1, (2+3)*2 (the reduced pair), 4*10+100, (5+6+7)*10
    assert simdist.run(body, world_size=2) == [100.0 + 1 + 10 + 140 + 180] * 2


def test_a_broadcast_root_may_read_what_it_sends() -> None:
    def body(ctx: simdist.RankContext) -> float:
        t = torch.full((2,), float(ctx.rank + 5))
        work = dist.broadcast(t, src=0, async_op=True)
        if ctx.rank == 0:
            seen = t.sum().item()  # the root's buffer is only read
        else:
            raises_race(t.sum)
            seen = 0.0
        work.wait()
        return seen + t.sum().item()

    assert simdist.run(body, world_size=2) == [20.0, 10.0]


def test_it_composes_with_a_users_dispatch_mode() -> None:
    def body(ctx: simdist.RankContext) -> int:
        t = torch.ones(2)
        with CommDebugMode() as comm:
            work = dist.all_reduce(t, async_op=True)
        work.wait()  # the user's mode left first; the sanitizer's must still go cleanly
        assert _get_current_dispatch_mode_stack() == []
        return comm.get_total_counts()

    assert simdist.run(body, world_size=2) == [1, 1]


def test_a_race_after_backward_is_caught_though_autograd_restores_the_modes() -> None:
    def body(ctx: simdist.RankContext) -> str:
        w = torch.ones(3, requires_grad=True)
        works = []
        w.register_post_accumulate_grad_hook(lambda p: works.append(dist.all_reduce(p.grad, async_op=True)))
        (w * 2).sum().backward()
        message = raises_race(w.grad.clone)
        works[0].wait()
        return message

    assert all("all_reduce" in m for m in simdist.run(body, world_size=2))


def test_a_helper_threads_ops_are_checked_too() -> None:
    def body(ctx: simdist.RankContext) -> bool:
        t = torch.ones(2)
        work = dist.all_reduce(t, async_op=True)
        caught: list[BaseException] = []

        def helper() -> None:
            try:
                t.add_(1)
            except simdist.AsyncRaceError as exc:
                caught.append(exc)

        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        work.wait()
        return len(caught) == 1

    assert simdist.run(body, world_size=2) == [True, True]


def test_a_pooled_rank_thread_keeps_no_mode_into_the_next_run() -> None:
    def racy(ctx: simdist.RankContext) -> None:
        t = torch.ones(2)
        dist.all_reduce(t, async_op=True)
        t.clone()

    with pytest.raises(simdist.RankError):
        simdist.run(racy, world_size=2)

    def clean(ctx: simdist.RankContext) -> list[object]:
        return sanitizer_modes()

    assert simdist.run(clean, world_size=2) == [[], []]


# -- options ---------------------------------------------------------------------------------------


def test_check_async_false_turns_it_off() -> None:
    def body(ctx: simdist.RankContext) -> None:
        t = torch.ones(2)
        work = dist.all_reduce(t, async_op=True)
        t.clone()
        work.wait()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert simdist.run(body, world_size=2, check_async=False) == [None, None]


@pytest.mark.parametrize("name", ["check_async", "strict_async", "check_group_order"])
def test_the_options_are_run_options_checked_as_bools(name: str) -> None:
    assert name in OPTION_NAMES  # the pytest marker accepts exactly these
    with pytest.raises(TypeError, match=name):
        RunOptions(world_size=2, **{name: 1})


@pytest.mark.simdist(world_size=2, check_async=False)
def test_the_marker_takes_check_async(ctx: simdist.RankContext) -> None:
    t = torch.ones(2)
    work = dist.all_reduce(t, async_op=True)
    t.clone()  # not refused: the marker turned the sanitizer off
    work.wait()


@pytest.mark.simdist(world_size=2)
def test_the_marker_has_it_on_by_default(ctx: simdist.RankContext) -> None:
    t = torch.ones(2)
    work = dist.all_reduce(t, async_op=True)
    with pytest.raises(simdist.AsyncRaceError):
        t.clone()
    work.wait()


# -- NCCL's cross-communicator order -------------------------------------------------------


def opposite_orders(ctx: simdist.RankContext, fixed: bool, backend: str | None = None) -> float:
    a = dist.new_group([0, 1], backend=backend)
    b = dist.new_group([0, 1], backend=backend)
    x, y = torch.ones(2), torch.ones(2)
    first, second = (a, b) if ctx.rank == 0 or fixed else (b, a)
    w1 = dist.all_reduce(x if first is a else y, group=first, async_op=True)
    w2 = dist.all_reduce(y if first is a else x, group=second, async_op=True)
    w1.wait()
    w2.wait()
    return float(x.sum() + y.sum())


def test_opposite_group_orders_are_refused_when_asked_for() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(opposite_orders, world_size=2, args=(False,), check_group_order=True)
    message = str(info.value.failures[1])
    assert message.startswith("rank 1 issued its all_reduce on group ")
    assert "rank 0 issued them in the opposite order" in message and "NCCL" in message
    assert simdist.run(opposite_orders, world_size=2, args=(True,), check_group_order=True) == [8.0, 8.0]


def test_opposite_group_orders_complete_as_on_gloo_by_default() -> None:
    assert simdist.run(opposite_orders, world_size=2, args=(False,)) == [8.0, 8.0]
    assert simdist.run(opposite_orders, world_size=2, args=(False, "gloo")) == [8.0, 8.0]


def test_opposite_group_orders_are_refused_on_groups_asked_for_as_nccl() -> None:
    """The program asked for NCCL's semantics: no option needed."""
    with pytest.raises(simdist.RankError) as info:
        simdist.run(opposite_orders, world_size=2, args=(False, "nccl"))
    message = str(info.value.failures[1])
    assert "rank 0 issued them in the opposite order" in message and "NCCL" in message
    assert simdist.run(opposite_orders, world_size=2, args=(True, "nccl")) == [8.0, 8.0]
    # check_async=False turns the whole sanitizer off, this check with it
    assert simdist.run(opposite_orders, world_size=2, args=(False, "nccl"), check_async=False) == [8.0, 8.0]


def test_a_call_issued_while_another_is_in_flight_is_not_shown_to_the_shadow_group() -> None:
    # The shadow (what a user's dispatch mode sees) runs c10d's own checks,
    # which refuse an empty all_to_all_single input simdist accepts: the
    # sanitizer's mode alone must not send calls down that path.
    def body(ctx: simdist.RankContext) -> list[float]:
        pending = torch.ones(2)
        work = dist.all_reduce(pending, async_op=True)
        rows = [0, 0] if ctx.rank == 0 else [2, 1]  # rank 0's input is empty
        send = torch.full((sum(rows), 1), float(ctx.rank + 1))
        recv_rows = [0, 2] if ctx.rank == 0 else [0, 1]
        out = torch.empty(sum(recv_rows), 1)
        dist.all_to_all_single(out, send, recv_rows, rows)
        work.wait()
        return out.flatten().tolist()

    assert simdist.run(body, world_size=2) == [[2.0, 2.0], [2.0]]


def test_a_helper_thread_ends_with_the_sanitizers_mode_off_its_stack() -> None:
    """A helper carries its rank's mode for its life; when its body is over the
    mode must leave the thread's dispatch stack. Left there, torch's C++
    thread-local state releases it after Python has let the thread go, and a
    process exiting at that moment aborted ("terminate called without an
    active exception", a third of the runs of a profiling helper under load)."""
    import sys
    import threading

    from torch._C import _len_torch_dispatch_stack

    after_run: list[int] = []

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == "run_as_rank":
            after_run.append(_len_torch_dispatch_stack())

    def body(ctx: simdist.RankContext) -> None:
        if ctx.rank == 0:

            def helper() -> None:
                t = torch.ones(2)
                dist.all_reduce(t, async_op=True).wait()

            thread = threading.Thread(target=helper)
            thread.start()
            thread.join()
        else:
            dist.all_reduce(torch.ones(2))

    threading.setprofile(watch)
    try:
        simdist.run(body, world_size=2, check_async=True)
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]  # None removes it; typeshed says no
        sys.setprofile(None)
    assert after_run == [0]
