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


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="Ctrl-C is not delivered as KeyboardInterrupt in this process",
)
def test_ctrl_c_takes_every_rank_down_before_the_caller_sees_it() -> None:
    assert threading.current_thread() is threading.main_thread()
    before = set(threading.enumerate())
    torch.manual_seed(7)
    state = torch.get_rng_state()
    with pytest.raises(KeyboardInterrupt):
        simdist.run(spin_then_ctrl_c_body, world_size=3, timeout=120.0)
    left = [
        t.name
        for t in threading.enumerate()
        if t not in before and t.is_alive() and t.name.startswith("simdist-rank")
    ]
    assert left == [], f"ranks still running after Ctrl-C: {left}"
    assert torch.equal(torch.get_rng_state(), state), "the caller's generator is put back"
    assert not dist.is_initialized()
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=60.0) == [0, 1]


def busy_counting_body(ctx: simdist.RankContext, progress: list[int]) -> int:
    if ctx.rank == 0:  # rank 0 runs first under any schedule that starts at all
        threading.Timer(0.3, signal.pthread_kill, (MAIN, signal.SIGINT)).start()
    dist.barrier()
    while True:  # compute-bound: only an interrupt stops it
        progress[ctx.rank] += 1


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="Ctrl-C is not delivered as KeyboardInterrupt in this process",
)
@pytest.mark.parametrize("schedule", ["rank", "concurrent"])
def test_after_ctrl_c_no_rank_makes_progress(schedule: str) -> None:
    """Judged by the ranks' own progress, not Thread.is_alive (which an
    interrupted join falsifies)."""
    import time

    progress = [0, 0, 0]
    with pytest.raises(KeyboardInterrupt):
        simdist.run(
            busy_counting_body,
            world_size=3,
            timeout=120.0,
            schedule=schedule,
            args=(progress,),
            share_args=True,
        )
    seen = list(progress)
    time.sleep(0.3)  # long enough for a live busy loop to count many times
    assert progress == seen, f"ranks still computing after Ctrl-C: {seen} -> {progress}"
    assert sum(seen) > 0
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=60.0) == [0, 1]


def blocked_in_c_then_ctrl_c_body(ctx: simdist.RankContext, blocker: threading.Event) -> int:
    if ctx.rank == 0:
        threading.Timer(0.3, signal.pthread_kill, (MAIN, signal.SIGINT)).start()
    dist.barrier()
    if ctx.rank == 1:
        blocker.wait()  # in C: no interrupt reaches it
    return ctx.rank


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="Ctrl-C is not delivered as KeyboardInterrupt in this process",
)
def test_ctrl_c_names_a_rank_it_cannot_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    import simdist._run.watchdog

    monkeypatch.setattr(simdist._run.watchdog, "GRACE_S", 0.3)
    blocker = threading.Event()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            simdist.run(
                blocked_in_c_then_ctrl_c_body, world_size=2, timeout=120.0, args=(blocker,), share_args=True
            )
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "simdist-rank-1" in notes and "in blocked_in_c_then_ctrl_c_body" in notes
    finally:
        blocker.set()
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=60.0) == [0, 1]
