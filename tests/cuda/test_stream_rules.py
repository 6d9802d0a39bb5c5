"""CUDA's stream ordering rules on emulated devices (simdist/_cuda/ordering.py).

Each racy program has a fixed twin that differs by the one call that orders
the two streams; the racy one must raise AsyncRaceError naming both
accesses, the twin must run clean and compute what the CPU computes. The
rules are the ones PyTorch's CUDA stream sanitizer (CSAN) applies on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist


def _outcome(body, **options) -> str:
    try:
        results = simdist.run(body, world_size=2, cuda="emulate", **options)
    except simdist.RankError as err:
        cause = err.__cause__
        return f"{type(cause).__name__}: {cause}"
    return f"ok {results}"


def _side_collective(fixed: bool):
    def body(ctx):
        compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
        t = torch.full((8,), float(ctx.rank + 1), device="cuda")
        side.wait_stream(compute)  # the all_reduce may read t
        with torch.cuda.stream(side):
            dist.all_reduce(t)  # waited on the side stream by c10d
        if fixed:
            compute.wait_stream(side)
        return float(t.sum())

    return body


def test_a_collective_on_a_side_stream_read_on_the_compute_stream_without_wait_stream() -> None:
    racy = _outcome(_side_collective(fixed=False))
    assert racy.startswith("AsyncRaceError: rank 0: aten.sum"), racy
    assert "on the default stream of cuda:0 reads memory that all_reduce on group world [0, 1] seq 0" in racy
    assert "test_stream_rules.py:" in racy  # the lines of both accesses
    assert _outcome(_side_collective(fixed=True)) == "ok [24.0, 24.0]"


def _event(fixed: bool):
    def body(ctx):
        compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            y = x * 3  # written on the side stream
            done = torch.cuda.Event()
            done.record()
        if fixed:
            done.wait()  # the compute stream waits for the event
        return float((y + 1).sum())

    return body


def test_an_event_recorded_but_not_waited_orders_nothing() -> None:
    racy = _outcome(_event(fixed=False))
    assert "aten.add" in racy and "reads memory that aten.mul" in racy, racy
    assert "on the default stream of cuda:0" in racy and "on stream 0x" in racy, racy  # both named
    assert _outcome(_event(fixed=True)) == "ok [16.0, 16.0]"


def _collective_reads_compute_write(fixed: bool):
    def body(ctx):
        compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
        t = torch.zeros(4, device="cuda")
        t.add_(ctx.rank + 1)  # written on the compute stream
        if fixed:
            side.wait_stream(compute)
        with torch.cuda.stream(side):
            work = dist.all_reduce(t, async_op=True)
            work.wait()
        compute.wait_stream(side)
        return t.tolist()

    return body


def test_a_side_stream_collective_on_a_buffer_the_compute_stream_just_wrote() -> None:
    racy = _outcome(_collective_reads_compute_write(fixed=False))
    assert "all_reduce on group world [0, 1] seq 0" in racy and "memory that aten.add_" in racy, racy
    assert (
        _outcome(_collective_reads_compute_write(fixed=True))
        == "ok [[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]"
    )


def _side_then_host(ctx, how: str):
    side = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = x * 2  # written on the side stream
        done = side.record_event()
    if how == "device":
        torch.cuda.synchronize()
    elif how == "stream":
        side.synchronize()
    elif how == "event":
        done.synchronize()
    return float(y.sum())  # read on the default stream


@pytest.mark.parametrize("how", ["device", "stream", "event"])
def test_a_host_synchronize_orders_the_streams_after_it(how: str) -> None:
    assert _outcome(_side_then_host, args=(how,)) == "ok [8.0, 8.0]"


def test_without_one_the_read_races_and_the_rules_follow_check_async() -> None:
    assert _outcome(_side_then_host, args=("nothing",)).startswith("AsyncRaceError")
    # The rules are part of the collective sanitizer: off with it.
    assert _outcome(_side_then_host, args=("nothing",), check_async=False) == "ok [8.0, 8.0]"


@pytest.mark.parametrize("steps", [1, 3])
def test_programs_on_one_stream_never_raise(steps: int) -> None:
    def body(ctx):
        model = torch.nn.Linear(4, 4).cuda()
        for _ in range(steps):
            loss = model(torch.randn(2, 4, device="cuda")).sum()
            loss.backward()
            for p in model.parameters():
                work = dist.all_reduce(p.grad, async_op=True)
                work.wait()
        return float(loss.detach())

    assert _outcome(body).startswith("ok")
