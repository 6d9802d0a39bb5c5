"""Threads a rank starts belong to that rank: they see its torch.distributed
state, their collectives are its calls, the deadlock check counts them, and
they are joined (or stopped, or reported) before the rank ends.

Expected values are worked out by hand from each program."""

from __future__ import annotations

import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
import simdist._run.watchdog

TIMEOUT = 60.0
SCHEDULES = ["rank", "random", "concurrent"]


def identity_body(ctx: simdist.RankContext) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    main_world = dist.group.WORLD

    def look(where: str) -> None:
        seen[where] = (
            dist.is_initialized(),
            dist.get_rank(),
            dist.get_world_size(),
            dist.group.WORLD is main_world,
        )

    thread = threading.Thread(target=look, args=("thread",))
    thread.start()
    thread.join()
    with ThreadPoolExecutor(2) as pool:
        pool.submit(look, "pool").result()
        # A helper's collective is its rank's call on the rank's default group.
        seen["pool_sum"] = pool.submit(lambda: _all_reduce_world(ctx.rank + 1)).result()
    return seen


def _all_reduce_world(value: float) -> float:
    t = torch.tensor([float(value)])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_helper_threads_and_pool_workers_see_their_ranks_state(schedule: str) -> None:
    results = simdist.run(identity_body, world_size=3, timeout=TIMEOUT, schedule=schedule)
    for rank, seen in enumerate(results):
        assert seen["thread"] == (True, rank, 3, True)
        assert seen["pool"] == (True, rank, 3, True)
        assert seen["pool_sum"] == 6.0  # 1 + 2 + 3


def crossing_body(ctx: simdist.RankContext) -> list[float]:
    """Rank 0's helper joins the pair's all_reduce while rank 0's main thread
    already waits on the world's; rank 1 does the pair's first. Not a deadlock:
    a rank is blocked only when all its threads are."""
    pair = dist.new_group([0, 1])
    got: list[float] = []
    if ctx.rank == 0:

        def helper() -> None:
            time.sleep(0.1)  # the main thread is waiting by now
            t = torch.tensor([10.0])
            dist.all_reduce(t, group=pair)
            got.append(t.item())

        thread = threading.Thread(target=helper)
        thread.start()
        got.insert(0, _all_reduce_world(1.0))
        thread.join()
        return got
    t = torch.tensor([20.0])
    dist.all_reduce(t, group=pair)
    return [_all_reduce_world(2.0), t.item()]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_helpers_collective_while_the_main_thread_waits_is_no_deadlock(schedule: str) -> None:
    results = simdist.run(crossing_body, world_size=2, timeout=TIMEOUT, schedule=schedule)
    assert results == [[3.0, 30.0], [3.0, 30.0]]


def helper_waits_on_a_finished_peer_body(ctx: simdist.RankContext) -> int:
    pair = dist.new_group([0, 1])
    if ctx.rank == 0:

        def helper() -> None:
            dist.all_reduce(torch.ones(1), group=pair)  # rank 1 never joins

        thread = threading.Thread(target=helper, name="stuck-helper")
        thread.start()
        thread.join()
    return ctx.rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_helper_waiting_on_a_peer_that_returned_is_a_deadlock(schedule: str) -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(helper_waits_on_a_finished_peer_body, world_size=2, timeout=TIMEOUT, schedule=schedule)
    assert "stuck-helper" in str(info.value)


def helper_cycle_body(ctx: simdist.RankContext) -> int:
    """Every thread of both ranks waits on the other rank: a true deadlock."""
    pair = dist.new_group([0, 1])
    if ctx.rank == 0:
        thread = threading.Thread(target=lambda: dist.all_reduce(torch.ones(1), group=pair))
        thread.start()
        dist.recv(torch.ones(1), src=1)  # rank 1 never sends
        thread.join()
        return 0
    dist.recv(torch.ones(1), src=0)  # rank 0 never sends
    return 1


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_thread_of_each_rank_waiting_on_the_other_is_a_deadlock(schedule: str) -> None:
    with pytest.raises(simdist.DeadlockError):
        simdist.run(helper_cycle_body, world_size=2, timeout=TIMEOUT, schedule=schedule)


def helper_raises_body(ctx: simdist.RankContext) -> int:
    def helper() -> None:
        if ctx.rank == 1:
            raise ValueError("helper of rank 1 broke")

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    return ctx.rank


def test_an_exception_in_a_helper_fails_its_rank() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(helper_raises_body, world_size=2, timeout=TIMEOUT)
    assert sorted(info.value.failures) == [1]
    assert isinstance(info.value.__cause__, ValueError)


def returns_before_helper_body(ctx: simdist.RankContext, out: dict[int, float]) -> int:
    def helper() -> None:
        time.sleep(0.05)
        out[ctx.rank] = _all_reduce_world(ctx.rank)

    threading.Thread(target=helper).start()  # never joined by the body
    return ctx.rank


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_rank_ends_after_its_non_daemon_helpers(schedule: str) -> None:
    out: dict[int, float] = {}
    assert simdist.run(
        returns_before_helper_body,
        world_size=3,
        timeout=TIMEOUT,
        schedule=schedule,
        args=(out,),
        share_args=True,
    ) == [0, 1, 2]
    assert out == {0: 3.0, 1: 3.0, 2: 3.0}


def daemon_spinner_body(ctx: simdist.RankContext, progress: list[int]) -> int:
    def spin() -> None:
        while True:
            progress[ctx.rank] += 1

    threading.Thread(target=spin, daemon=True).start()
    time.sleep(0.05)
    return ctx.rank


def test_daemon_helpers_are_stopped_when_their_rank_ends() -> None:
    progress = [0, 0]
    before = set(threading.enumerate())
    assert simdist.run(
        daemon_spinner_body, world_size=2, timeout=TIMEOUT, args=(progress,), share_args=True
    ) == [0, 1]
    seen = list(progress)
    time.sleep(0.2)
    assert progress == seen and sum(seen) > 0
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def daemon_blocked_in_c_body(ctx: simdist.RankContext, blocker: threading.Event) -> int:
    if ctx.rank == 1:
        threading.Thread(target=blocker.wait, name="c-blocked-helper", daemon=True).start()
    return ctx.rank


def test_a_helper_that_cannot_be_stopped_is_reported_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(simdist._run.watchdog, "GRACE_S", 0.3)
    blocker = threading.Event()
    try:
        with pytest.raises(simdist.RankError) as info:
            simdist.run(
                daemon_blocked_in_c_body, world_size=2, timeout=TIMEOUT, args=(blocker,), share_args=True
            )
        assert sorted(info.value.failures) == [1]
        assert "c-blocked-helper" in str(info.value.__cause__)
    finally:
        blocker.set()
    # A later run is unaffected.
    assert simdist.run(lambda ctx: _all_reduce_world(1.0), world_size=2, timeout=TIMEOUT) == [2.0, 2.0]


def test_a_helper_that_cannot_be_stopped_is_waited_for_and_reported_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The report a returned rank raises for a helper it left running is the
    # rank's failure; its failure path used to wait the grace out again and
    # add the same report as a note ("body failed"), so the cause's
    # traceback named the helper twice and the run took two graces.
    import simdist._run.rank as rank_module

    monkeypatch.setattr(simdist._run.watchdog, "GRACE_S", 0.3)
    reports: list[int] = []
    real = rank_module._unstoppable_helpers

    def counted(rank: int, left: Any, returned: bool) -> str:
        reports.append(rank)
        return real(rank, left, returned)

    monkeypatch.setattr(rank_module, "_unstoppable_helpers", counted)
    blocker = threading.Event()
    try:
        with pytest.raises(simdist.RankError) as info:
            simdist.run(
                daemon_blocked_in_c_body, world_size=2, timeout=TIMEOUT, args=(blocker,), share_args=True
            )
    finally:
        blocker.set()
    cause = info.value.__cause__
    assert isinstance(cause, simdist.SimulationError)
    assert reports == [1]
    assert getattr(cause, "__notes__", []) == []
    shown = "".join(traceback.format_exception(cause))
    assert shown.count("could not be stopped") == 1 and shown.count("c-blocked-helper") == 1
    assert "body returned" in shown


MAIN = threading.main_thread().ident


def busy_helper_body(ctx: simdist.RankContext, progress: list[int]) -> int:
    def spin() -> None:
        while True:
            progress[ctx.rank] += 1

    threading.Thread(target=spin).start()
    if ctx.rank == 0:
        threading.Timer(0.3, signal.pthread_kill, (MAIN, signal.SIGINT)).start()
    dist.barrier()
    dist.barrier()
    return ctx.rank


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="Ctrl-C is not delivered as KeyboardInterrupt in this process",
)
def test_ctrl_c_stops_busy_helper_threads_too() -> None:
    progress = [0, 0]
    with pytest.raises(KeyboardInterrupt):
        # The bodies return at once, then wait for their never-ending helpers.
        simdist.run(busy_helper_body, world_size=2, timeout=120.0, args=(progress,), share_args=True)
    seen = list(progress)
    time.sleep(0.3)
    assert progress == seen and sum(seen) > 0


def hands_its_group_out_body(
    ctx: simdist.RankContext, box: list[Any], go: threading.Event, done: threading.Event
) -> float:
    if ctx.rank == 0:
        box.append(dist.group.WORLD)
        go.set()
        assert done.wait(30)  # the outsider tries the group meanwhile
    return _all_reduce_world(ctx.rank + 1)


def test_a_thread_outside_the_run_cannot_act_as_a_rank() -> None:
    box: list[Any] = []
    go, done = threading.Event(), threading.Event()
    errors: list[str] = []

    def outsider() -> None:
        try:
            go.wait(30)
            for attempt in (
                lambda: dist.all_reduce(torch.ones(1), group=box[0]),
                lambda: box[0].allreduce([torch.ones(1)]),
                lambda: box[0].send([torch.ones(1)], 1, 0),
            ):
                try:
                    attempt()
                    errors.append("accepted")
                except simdist.SimulationError as exc:  # caught, and the outsider goes on
                    errors.append(str(exc))
        finally:
            done.set()

    thread = threading.Thread(target=outsider)
    thread.start()
    results = simdist.run(
        hands_its_group_out_body,
        world_size=2,
        timeout=TIMEOUT,
        schedule="concurrent",
        args=(box, go, done),
        share_args=True,
    )
    thread.join(30)
    assert results == [3.0, 3.0]  # the outsider's calls never joined rank 0's
    assert len(errors) == 3
    assert all("a thread outside the run" in e and "rank 0" in e for e in errors), errors


def join_at_once_body(ctx: simdist.RankContext) -> float:
    """Rank 0's main thread joins its helper at once, while the helper's
    collective needs rank 1 to run: the join must give up the run token."""
    if ctx.rank == 0:
        out: list[float] = []
        thread = threading.Thread(target=lambda: out.append(_all_reduce_world(5.0)))
        thread.start()
        thread.join()
        return out[0]
    return _all_reduce_world(7.0)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_joining_a_helper_lets_the_other_ranks_run(schedule: str) -> None:
    assert simdist.run(join_at_once_body, world_size=2, timeout=TIMEOUT, schedule=schedule) == [12.0, 12.0]


def idle_pool_cycle_body(ctx: simdist.RankContext, pools: list[Any]) -> int:
    """Rank 0 keeps an idle pool, then both ranks wait on each other: the
    idle worker is blocked too, so this is a deadlock, not a timeout."""
    if ctx.rank == 0:
        pool = ThreadPoolExecutor(2)
        pools.append(pool)
        assert pool.submit(dist.get_rank).result() == 0
        dist.recv(torch.ones(1), src=1)
        return 0
    dist.recv(torch.ones(1), src=0)
    return 1


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_idle_pool_workers_count_as_blocked(schedule: str) -> None:
    pools: list[Any] = []
    with pytest.raises(simdist.DeadlockError):
        simdist.run(
            idle_pool_cycle_body,
            world_size=2,
            timeout=TIMEOUT,
            schedule=schedule,
            args=(pools,),
            share_args=True,
        )


def forgotten_pool_body(ctx: simdist.RankContext) -> float:
    pool = ThreadPoolExecutor(2)  # never shut down, as a process's exit would
    return pool.submit(_all_reduce_world, ctx.rank + 1).result()


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_pool_never_shut_down_ends_with_its_rank(schedule: str) -> None:
    before = set(threading.enumerate())
    assert simdist.run(forgotten_pool_body, world_size=3, timeout=TIMEOUT, schedule=schedule) == [
        6.0,
        6.0,
        6.0,
    ]
    time.sleep(0.1)
    assert [t for t in threading.enumerate() if t not in before and t.is_alive()] == []


def test_a_pool_created_outside_the_run_stays_its_owners() -> None:
    # A module-level executor used by the ranks: its workers are not the ranks'
    # helpers, and a rank's end must not shut the caller's pool down.
    pool = ThreadPoolExecutor(1)
    try:

        def body(ctx):
            return pool.submit(lambda r: 21 * r, ctx.rank + 1).result()

        assert simdist.run(body, world_size=2, timeout=30) == [21, 42]
        assert pool.submit(lambda: 7).result(timeout=10) == 7
    finally:
        pool.shutdown(wait=True)
