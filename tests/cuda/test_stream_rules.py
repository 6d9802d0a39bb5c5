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


# ------------------------------------------------------------ frees (the caching allocator's rule)


def _freed_while_side_reads(fix: str):
    def body(ctx):
        compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
        x = torch.full((8,), float(ctx.rank + 1), device="cuda")  # made on the compute stream
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            y = x * 2  # read on the side stream
        if fix == "record_stream":
            x.record_stream(side)  # the allocator keeps x's memory until side's work is done
        elif fix == "wait_stream":
            compute.wait_stream(side)  # side's use is ordered before the free
        del x  # freed: the compute stream's next allocation may reuse the memory at once
        compute.wait_stream(side)
        return float(y.sum())

    return body


def test_a_buffer_freed_without_record_stream_while_a_side_stream_reads_it() -> None:
    racy = _outcome(_freed_while_side_reads("nothing"))
    assert racy.startswith(
        "AsyncRaceError: rank 0: a tensor made on the default stream of cuda:0 was freed at"
    ), racy
    assert "test_stream_rules.py:" in racy  # the line of the free
    assert "while aten.mul at" in racy and "on stream 0x" in racy and "read its memory" in racy, racy
    assert "record_stream()" in racy
    assert _outcome(_freed_while_side_reads("record_stream")) == "ok [16.0, 32.0]"
    assert _outcome(_freed_while_side_reads("wait_stream")) == "ok [16.0, 32.0]"


def test_a_side_stream_collective_buffer_freed_before_its_stream_is_waited_for() -> None:
    def body(ctx, fixed: bool):
        compute, side = torch.cuda.current_stream(), torch.cuda.Stream()
        t = torch.ones(4, device="cuda")
        side.wait_stream(compute)
        with torch.cuda.stream(side):
            dist.all_reduce(t)  # waited on the side stream: the collective writes t
            total = t * 1  # read on the side stream
        if fixed:
            t.record_stream(side)
        del t
        compute.wait_stream(side)
        return float(total.sum())

    racy = _outcome(body, args=(False,))
    assert "was freed at" in racy and "all_reduce on group world" not in racy.split("while")[0], racy
    assert _outcome(body, args=(True,)) == "ok [8.0, 8.0]"


def test_a_free_found_at_the_end_of_the_body_is_still_reported() -> None:
    # The last use is the free itself, when the body returns: no later kernel.
    def body(ctx):
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            x.mul_(2)  # written on the side stream
        return None  # x freed on the way out, side never waited for

    assert _outcome(body).startswith("AsyncRaceError: rank 0: a tensor made on the default stream")


def test_memory_made_on_a_side_stream_and_freed_there_is_fine() -> None:
    def body(ctx):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                scratch = torch.ones(16, device="cuda") * 2  # made, used, freed on side
                del scratch
        torch.cuda.current_stream().wait_stream(side)
        return 1

    assert _outcome(body) == "ok [1, 1]"
