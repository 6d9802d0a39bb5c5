"""Programs with planted failures, driven through real pdb sessions by tests/debug/test_debug.py.

Not collected by the normal run (the file name does not start with ``test_``);
the tests run pytest on it in a subprocess, feeding the debugger through a pipe.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

import simdist


@pytest.mark.simdist(world_size=2)
def test_rank1_disagrees(ctx):
    local_value = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(local_value)  # 1 + 2 = 3 on both ranks
    if ctx.rank == 1:
        assert local_value.item() == 4.0, "planted: rank 1 expects 4"
    dist.all_reduce(local_value)


@pytest.mark.simdist(layout=simdist.Layout(tp=2, dp=2))
def test_layout_rank3_fails(ctx):
    local_value = ctx.rank * 100  # noqa: F841 (read at the debugger prompt)
    dist.barrier()
    assert ctx.rank != 3, "planted: rank 3 fails"


def test_run_in_a_test(simdist_run):
    def body(ctx):
        local_value = f"value of rank {ctx.rank}"  # noqa: F841 (read at the prompt)
        dist.barrier()
        assert ctx.rank == 0, "planted: only rank 0 passes"

    simdist_run(body, world_size=2)


@pytest.mark.simdist(world_size=2)
def test_deadlock(ctx):
    t = torch.ones(2)
    if ctx.rank == 1:
        dist.recv(t, src=0)  # rank 0 never sends: it waits in the all_reduce
    dist.all_reduce(t)


@pytest.mark.simdist(world_size=2)
def test_mismatch(ctx):
    t = torch.ones(2)
    if ctx.rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


@pytest.mark.simdist(world_size=2, break_at={"rank": 1, "op": "all_reduce", "nth": 3})
def test_break_before_planted(ctx):
    x = torch.ones(1)
    for step in range(4):
        dist.all_reduce(x)
        # planted: rank 1 fails right after its third all_reduce (step 2)
        assert not (ctx.rank == 1 and step == 2), f"planted failure at step {step}"


@pytest.mark.simdist(world_size=2)
def test_breakpoint_in_rank0(ctx):
    t = torch.ones(1) * (ctx.rank + 1)
    if ctx.rank == 0:
        local_value = "at the breakpoint"  # noqa: F841 (read at the prompt)
        breakpoint()
    dist.all_reduce(t)
    assert t.item() == 3.0


@pytest.mark.simdist(world_size=2)
def test_slow_rank(ctx):
    # For faulthandler_timeout: rank 0 computes "for a long time".
    if ctx.rank == 0:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            time.sleep(0.01)
    dist.barrier()


def test_trace_of_caught_failure_is_not_kept(simdist_run):
    def body(ctx):
        assert ctx.rank == 0

    with pytest.raises(simdist.RankError):
        simdist_run(body, world_size=2)


def test_zz_no_thread_left():
    # Runs last in the file: whatever was quit before, no rank or helper thread is left.
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print(f"THREADS LEFT: {left}")
    assert not [n for n in left if n.startswith("simdist")], left
