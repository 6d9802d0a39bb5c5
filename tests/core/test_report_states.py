"""Timeout and deadlock reports give each rank's state as its flight record
does: a rank inside a call is waiting in it, never "running", and a helper
thread blocked outside simdist is named."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import simdist


def helper_blocked_outside_body(ctx: simdist.RankContext, release: threading.Event) -> int:
    if ctx.rank == 0:
        threading.Thread(target=release.wait, name="peer-waiter").start()
        return 0
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 never joins: it waits for its helper
    return 1


@pytest.mark.parametrize("schedule", ["rank", "concurrent"])
def test_a_timeout_names_the_blocked_helper_and_the_rank_waiting_in_its_call(schedule: str) -> None:
    release = threading.Event()
    try:
        with pytest.raises(simdist.SimulationTimeout) as info:
            simdist.run(
                helper_blocked_outside_body,
                world_size=2,
                timeout=1.5,
                schedule=schedule,
                args=(release,),
                share_args=True,
            )
    finally:
        release.set()
    message = str(info.value)
    report = message.split("last calls per rank")[0]
    assert "rank 1 (rank 1 of 2): waiting in all_reduce on world [0, 1] seq 0" in report
    assert "helper thread 'peer-waiter': running" in report
    # Nothing but the helper runs: no rank is called running.
    assert report.startswith("watchdog: 0 rank(s) still running")
    # The flight record agrees: rank 1's all_reduce started, never ended.
    assert "seq 0 shapes [[1]] float32 4 B" in message and "started" in message


def busy_and_waiting_body(ctx: simdist.RankContext) -> int:
    if ctx.rank == 0:
        while True:  # never joins
            pass
    dist.barrier()
    return ctx.rank


def test_a_timeout_tells_the_busy_rank_from_the_waiting_one() -> None:
    with pytest.raises(simdist.SimulationTimeout) as info:
        simdist.run(busy_and_waiting_body, world_size=2, timeout=1.0, schedule="concurrent")
    report = str(info.value).split("last calls per rank")[0]
    assert report.startswith("watchdog: 1 rank(s) still running")
    assert "rank 0 (rank 0 of 2):\n" in report
    assert (
        "rank 1 (rank 1 of 2): waiting in barrier on world [0, 1] seq 0; still missing rank(s) [0]" in report
    )
