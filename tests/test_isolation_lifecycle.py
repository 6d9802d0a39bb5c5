"""Ending a scheduled run early: Ctrl-C and the watchdog take every rank down."""

from __future__ import annotations

import signal
import threading

import pytest
import torch
import torch.distributed as dist

import simdist

MAIN = threading.main_thread().ident


def spin_then_ctrl_c_body(ctx: simdist.RankContext) -> int:
    dist.barrier()
    torch.manual_seed(100 + ctx.rank)
    if ctx.rank == 0:  # the rank run() joins first: its interrupted join must not hide it
        # Started from inside the run, so it cannot fire before or after it.
        threading.Timer(0.2, signal.pthread_kill, (MAIN, signal.SIGINT)).start()
        while True:
            pass
    return ctx.rank


@pytest.mark.skipif(signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
                    reason="Ctrl-C is not delivered as KeyboardInterrupt in this process")
def test_ctrl_c_takes_every_rank_down_before_the_caller_sees_it() -> None:
    assert threading.current_thread() is threading.main_thread()
    before = set(threading.enumerate())
    torch.manual_seed(7)
    state = torch.get_rng_state()
    with pytest.raises(KeyboardInterrupt):
        simdist.run(spin_then_ctrl_c_body, world_size=3, timeout=120.0)
    left = [t.name for t in threading.enumerate()
            if t not in before and t.is_alive() and t.name.startswith("simdist-rank")]
    assert left == [], f"ranks still running after Ctrl-C: {left}"
    assert torch.equal(torch.get_rng_state(), state), "the caller's generator is put back"
    assert not dist.is_initialized()
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=60.0) == [0, 1]
