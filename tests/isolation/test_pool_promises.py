"""A rank's thread pools, as a process's: work a rank left queued still runs
at its end (plain and collective work items, every schedule), a fault in a
pool worker's collective gives one outcome per seed, and the deadlock check
still sees real deadlocks among pool work.

Expected values are worked out by hand from each program."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist

import simdist

TIMEOUT = 60.0
SCHEDULES = ["rank", "random", "concurrent"]


def left_queued_body(ctx: simdist.RankContext, ran: dict[int, list[int]]) -> int:
    pool = ThreadPoolExecutor(1)
    for i in range(3):
        pool.submit(lambda i=i: (time.sleep(0.01), ran.setdefault(ctx.rank, []).append(i)))
    return ctx.rank


@pytest.mark.parametrize("world_size", [1, 3])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_work_a_rank_left_queued_runs_and_the_run_succeeds(schedule: str, world_size: int) -> None:
    ran: dict[int, list[int]] = {}
    results = simdist.run(
        left_queued_body,
        world_size=world_size,
        schedule=schedule,
        timeout=TIMEOUT,
        args=(ran,),
        share_args=True,
    )
    assert results == list(range(world_size))
    assert ran == {r: [0, 1, 2] for r in range(world_size)}


def queued_collectives_body(ctx: simdist.RankContext, out: dict[int, list[float]]) -> int:
    # One worker: the items run in order on every rank, so their all_reduces match.
    pool = ThreadPoolExecutor(1)

    def item(i: int) -> None:
        t = torch.tensor([float(i + ctx.rank)])
        dist.all_reduce(t)
        out.setdefault(ctx.rank, []).append(t.item())

    for i in range(3):
        pool.submit(item, i)
    return ctx.rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_queued_collective_work_items_complete_and_the_run_succeeds(schedule: str) -> None:
    out: dict[int, list[float]] = {}
    assert simdist.run(
        queued_collectives_body,
        world_size=2,
        schedule=schedule,
        timeout=TIMEOUT,
        args=(out,),
        share_args=True,
    ) == [0, 1]
    # item i: (i + 0) + (i + 1)
    assert out == {0: [1.0, 3.0, 5.0], 1: [1.0, 3.0, 5.0]}


def queued_for_a_peers_main_thread_body(ctx: simdist.RankContext) -> float:
    # Rank 0's all_reduce runs on its pool after its body returned; rank 1
    # joins it from its main thread.
    t = torch.tensor([float(ctx.rank + 1)])
    if ctx.rank == 0:
        ThreadPoolExecutor(1).submit(dist.all_reduce, t)
        return -1.0
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_queued_work_meets_a_peers_main_thread(schedule: str) -> None:
    assert simdist.run(
        queued_for_a_peers_main_thread_body, world_size=2, schedule=schedule, timeout=TIMEOUT
    ) == [
        -1.0,
        3.0,
    ]


def shut_down_by_the_body(ctx: simdist.RankContext, ran: list[int]) -> int:
    pool = ThreadPoolExecutor(2)
    for i in range(4):
        pool.submit(lambda i=i: (time.sleep(0.005), ran.append(i)))
    pool.shutdown(wait=False)  # the body's own shutdown: queued items still run
    return ctx.rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_pool_the_body_shut_down_without_waiting_still_runs_its_queue(schedule: str) -> None:
    ran: list[int] = []
    assert simdist.run(
        shut_down_by_the_body, world_size=1, schedule=schedule, timeout=TIMEOUT, args=(ran,), share_args=True
    ) == [0]
    assert sorted(ran) == [0, 1, 2, 3]


def queued_item_waits_on_a_finished_peer(ctx: simdist.RankContext) -> int:
    if ctx.rank == 0:
        ThreadPoolExecutor(1).submit(dist.recv, torch.zeros(1), 1)  # rank 1 never sends
    return ctx.rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_queued_work_that_can_never_complete_is_still_a_deadlock(schedule: str) -> None:
    with pytest.raises(simdist.DeadlockError, match="recv from rank 1"):
        simdist.run(queued_item_waits_on_a_finished_peer, world_size=2, schedule=schedule, timeout=TIMEOUT)


def helper_thread_submits(ctx: simdist.RankContext, ran: list[int]) -> int:
    pool = ThreadPoolExecutor(1)

    def submitter() -> None:
        for i in range(3):
            pool.submit(lambda i=i: (time.sleep(0.005), ran.append(i)))

    t = threading.Thread(target=submitter)
    t.start()
    t.join()
    return ctx.rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_work_queued_by_a_helper_thread_runs_at_the_ranks_end(schedule: str) -> None:
    ran: list[int] = []
    assert simdist.run(
        helper_thread_submits, world_size=1, schedule=schedule, timeout=TIMEOUT, args=(ran,), share_args=True
    ) == [0]
    assert ran == [0, 1, 2]


def faulted_pool_body(ctx: simdist.RankContext) -> list[float]:
    # One worker: each rank's three all_reduces run in order, so the seeded
    # fault hits the same call on every run.
    with ThreadPoolExecutor(1) as pool:

        def item(i: int) -> float:
            t = torch.ones(1) * ctx.rank
            dist.all_reduce(t)
            return t.item()

        futures = [pool.submit(item, i) for i in range(3)]
        return [f.result() for f in futures]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_fault_in_a_pool_workers_collective_gives_one_outcome(
    schedule: str, capfd: pytest.CaptureFixture
) -> None:
    plan = simdist.FaultPlan.crash(rank=1, op="all_reduce", nth=3)
    for _ in range(6):
        with pytest.raises(simdist.RankError) as info:
            simdist.run(faulted_pool_body, world_size=4, faults=plan, schedule=schedule, timeout=TIMEOUT)
        # Rank 1's worker crashes at its last call; every other rank waits
        # on rank 1 in that call and is released by its failure.
        assert list(info.value.failures) == [1]
        assert isinstance(info.value.failures[1], simdist.InjectedFault)
        assert info.value.released == (0, 2, 3)
    err = capfd.readouterr().err
    assert "exception calling callback" not in err
    assert "Exception in worker" not in err


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_fault_that_strands_a_pool_workers_next_call_is_always_a_deadlock(
    schedule: str, capfd: pytest.CaptureFixture
) -> None:
    # Rank 1 crashes at its second call; its third runs on and waits for the
    # others' third, while they wait for rank 1 in their second: on a real
    # cluster a hang. Every run: a DeadlockError that takes down every rank.
    plan = simdist.FaultPlan.crash(rank=1, op="all_reduce", nth=2)
    for _ in range(4):
        with pytest.raises(simdist.DeadlockError) as info:
            simdist.run(faulted_pool_body, world_size=4, faults=plan, schedule=schedule, timeout=TIMEOUT)
        assert sorted(info.value.failures) == [0, 1, 2, 3]  # type: ignore[attr-defined]
    assert "exception calling callback" not in capfd.readouterr().err


def failing_rank_with_queued_work(ctx: simdist.RankContext, ran: list[int]) -> int:
    pool = ThreadPoolExecutor(1)
    started = threading.Event()

    def first() -> None:
        started.set()
        time.sleep(0.05)

    pool.submit(first)
    for i in range(3):
        pool.submit(ran.append, i)
    started.wait(10)
    raise ValueError("the body fails while work is queued")


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_failed_ranks_queued_work_is_cancelled_as_a_dead_process_s(
    schedule: str, capfd: pytest.CaptureFixture
) -> None:
    ran: list[int] = []
    with pytest.raises(simdist.RankError, match="the body fails while work is queued"):
        simdist.run(
            failing_rank_with_queued_work,
            world_size=1,
            schedule=schedule,
            timeout=TIMEOUT,
            args=(ran,),
            share_args=True,
        )
    assert ran == []
    assert "Exception in worker" not in capfd.readouterr().err
