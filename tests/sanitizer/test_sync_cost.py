"""Synchronous code pays nothing for the sanitizer, counted, not timed.

Each rank counts, with ``sys.setprofile`` on its own thread, the Python calls
it makes into ``simdist/_sanitizer`` and its pushes onto the dispatch-mode
stack while it runs a loop of synchronous collectives and P2P. With the
sanitizer on, the loop must never meet the mode (no push, no
``__torch_dispatch__``), make no in-flight entry and format no call site,
and make exactly the sanitizer calls it makes with the sanitizer off: a fixed
few per call, whatever the loop's length. A positive control after the loop
(an async call and an op while it is in flight) shows the counter sees the
mode when it is there.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
from types import FrameType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._C import _push_on_torch_dispatch_stack

import simdist
import simdist._sanitizer

_SANITIZER_DIR = os.path.dirname(os.path.abspath(simdist._sanitizer.__file__)) + os.sep


class Counter:
    """Calls into the sanitizer's modules by function name, and dispatch-stack pushes."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.pushes = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code.co_filename.startswith(_SANITIZER_DIR):
                self.calls[f"{os.path.basename(code.co_filename)}:{code.co_qualname}"] += 1
        elif event == "c_call" and arg is _push_on_torch_dispatch_stack:
            self.pushes += 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def sync_calls(ctx: simdist.RankContext) -> None:
    """One round of every synchronous form: collectives, and a send/recv pair."""
    n = ctx.world_size
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.reduce(t, 0)
    outs = [torch.empty(4) for _ in range(n)]
    dist.all_gather(outs, t)
    flat = torch.empty(4 * n)
    dist.all_gather_single(flat, t)
    dist.reduce_scatter_single(t, flat)
    dist.all_to_all_single(flat, flat.clone())
    dist.barrier()
    peer = (ctx.rank + 1) % n
    if ctx.rank == 0:
        dist.send(t, peer)
        dist.recv(t, n - 1)
    else:
        dist.recv(t, ctx.rank - 1)
        dist.send(t, peer)


SYNC_CALLS_PER_ROUND = 10  # collectives and P2P calls in one ``sync_calls`` round, per rank


def counted(ctx: simdist.RankContext, rounds: int) -> tuple[Counter, Counter]:
    """The sync loop's counts, then those of the positive control."""
    sync_calls(ctx)  # warm-up: first-use caches (groups, code-site tables) are not the loop's
    loop = Counter()
    sys.setprofile(loop)
    try:
        for _ in range(rounds):
            sync_calls(ctx)
    finally:
        sys.setprofile(None)
    control = Counter()
    t = torch.ones(4)
    sys.setprofile(control)
    try:
        work = dist.all_reduce(t, async_op=True)
        torch.ones(2).add_(1)  # other memory: checked, not refused
        work.wait()
    finally:
        sys.setprofile(None)
    return loop, control


def run(rounds: int, check: bool) -> list[tuple[Counter, Counter]]:
    return simdist.run(counted, world_size=2, args=(rounds,), check_async=check)


def test_synchronous_calls_never_meet_the_mode_and_pay_what_they_pay_with_it_off() -> None:
    short, long = run(2, True), run(6, True)
    off = run(6, False)
    for rank in range(2):
        loop, control = long[rank]
        # The counter sees the mode when something is in flight (it could fail).
        assert control.pushes >= 1 and control.calls["mode.py:SanitizerMode.__torch_dispatch__"] >= 1
        # The synchronous loop: never the mode, no entry, no site, no report.
        assert loop.pushes == 0, loop.calls
        for name in loop.calls:
            assert not name.startswith(("mode.py:", "stack.py:", "inflight.py:", "report.py:", "book.py:")), (
                name
            )
        # Exactly what the same loop costs with the sanitizer off...
        assert loop.calls == off[rank][0].calls
        # ...a fixed few calls per collective, the same for every round.
        per_round, rest = divmod(loop.total - short[rank][0].total, 6 - 2)
        assert rest == 0 and loop.total == 6 * per_round
        assert per_round <= 5 * SYNC_CALLS_PER_ROUND, loop.calls


# -- what synchronous calls still get ----------------------------------------------------------


def test_a_synchronous_call_with_another_in_flight_still_counts_for_the_group_order() -> None:
    def body(ctx: simdist.RankContext) -> float:
        a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
        x, y = torch.ones(2), torch.ones(2)
        first, second = (a, b) if ctx.rank == 0 else (b, a)
        work = dist.all_reduce(x, group=first, async_op=True)
        dist.all_reduce(y, group=second)  # synchronous, issued while the first is in flight
        work.wait()
        return float(x.sum() + y.sum())

    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, world_size=2, check_group_order=True)
    assert "rank 0 issued them in the opposite order" in str(info.value.failures[1])
    assert simdist.run(body, world_size=2) == [8.0, 8.0]  # gloo completes it


def test_a_helper_thread_racing_a_synchronous_call_of_its_rank_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a rank has a helper thread, its synchronous calls go in flight: the
    helper may write a buffer while the rank waits (a race on gloo's worker)."""
    from simdist._backend.work import SimWork
    from simdist._core.records import PendingCollective

    waiting = threading.Event()
    original = SimWork.wait

    def wait(self: SimWork, timeout: Any = None) -> bool:
        if self._rank == 0 and isinstance(self._waitable, PendingCollective):
            waiting.set()  # rank 0 is now inside its synchronous all_reduce
        return original(self, timeout)

    def body(ctx: simdist.RankContext) -> list[str]:
        t, flag = torch.ones(2), torch.zeros(1)
        caught: list[str] = []
        if ctx.rank == 0:

            def helper() -> None:
                waiting.wait(timeout=30)
                try:
                    t.add_(1)
                except simdist.AsyncRaceError as exc:
                    caught.append(str(exc))
                dist.send(flag, 1)  # only now may rank 1 join the all_reduce

            thread = threading.Thread(target=helper)
            thread.start()
            dist.all_reduce(t)
            thread.join()
        else:
            dist.recv(flag, 0)
            dist.all_reduce(t)
        return caught

    monkeypatch.setattr(SimWork, "wait", wait)
    caught, nothing = simdist.run(body, world_size=2)
    assert nothing == [] and len(caught) == 1
    assert caught[0].startswith("rank 0: aten.add_ at ") and "all_reduce on group world" in caught[0]


def test_a_backend_call_whose_options_say_synchronous_is_taken_at_its_word() -> None:
    """``asyncOp=False`` is how c10d's wrappers say they wait at once: a program
    that calls the backend itself with it and reads first is not refused (see
    docs/differences.md, ``sync-options-trusted``); the default options are."""

    def body(ctx: simdist.RankContext) -> list[object]:
        group = dist.group.WORLD
        assert group is not None
        t = torch.ones(2)
        opts = dist.AllreduceOptions()
        opts.asyncOp = False
        work = group.allreduce([t], opts)
        t.clone()  # not refused
        work.wait()
        work = group.allreduce([t], dist.AllreduceOptions())
        with pytest.raises(simdist.AsyncRaceError):
            t.clone()
        work.wait()
        return t.tolist()

    assert simdist.run(body, world_size=2) == [[4.0, 4.0]] * 2


def send(tensor: torch.Tensor, dst: int) -> dist.Work | None:
    """A program's own ``send`` around ``isend``: not c10d's, so not synchronous."""
    return dist.isend(tensor, dst)


@pytest.mark.parametrize("form", ["batch_isend_irecv", "own_send_wrapper"])
def test_p2p_that_c10d_does_not_wait_for_at_once_stays_in_flight(form: str) -> None:
    def body(ctx: simdist.RankContext) -> str:
        t = torch.ones(4) if ctx.rank == 0 else torch.zeros(4)
        if form == "batch_isend_irecv":
            op = dist.isend if ctx.rank == 0 else dist.irecv
            (work,) = dist.batch_isend_irecv([dist.P2POp(op, t, 1 - ctx.rank)])
        elif ctx.rank == 0:
            work = send(t, 1)
        else:
            work = dist.irecv(t, 0)
        assert work is not None
        with pytest.raises(simdist.AsyncRaceError) as info:
            t.fill_(7.0)  # a write races with the send's read and the recv's write alike
        work.wait()
        return str(info.value)

    sent, received = simdist.run(body, world_size=2)
    assert "isend to rank 1" in sent and "irecv from rank 0" in received
