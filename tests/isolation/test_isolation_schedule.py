"""The run token: one rank at a time, in an order fixed by the policy and seed."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout

TIMEOUT = 60.0


def logging_body(ctx: simdist.RankContext, log: list[tuple[int, str]]) -> None:
    log.append((ctx.rank, "a"))
    dist.barrier()
    log.append((ctx.rank, "b"))


def interleaving(**kwargs: object) -> list[tuple[int, str]]:
    log: list[tuple[int, str]] = []
    simdist.run(logging_body, world_size=3, args=(log,), share_args=True, timeout=TIMEOUT, **kwargs)
    return log


def test_rank_order_runs_the_lowest_runnable_rank_until_it_blocks() -> None:
    # 0 and 1 block in the barrier; 2 completes it and runs on; then 0, then 1.
    want = [(0, "a"), (1, "a"), (2, "a"), (2, "b"), (0, "b"), (1, "b")]
    for _ in range(3):
        assert interleaving() == want


def test_a_seeded_random_schedule_repeats_and_seeds_differ() -> None:
    runs = {seed: interleaving(schedule="random", schedule_seed=seed) for seed in range(8)}
    for seed in (0, 5):
        assert interleaving(schedule="random", schedule_seed=seed) == runs[seed]
    assert len({tuple(r) for r in runs.values()}) > 1, "eight seeds all gave one interleaving"
    for log in runs.values():
        assert sorted(log) == sorted(interleaving())


def p2p_race_body(ctx: simdist.RankContext, log: list[int]) -> float:
    """Ranks 1..n-1 each send to rank 0; the senders log the order they ran in."""
    t = torch.zeros(1)
    if ctx.rank == 0:
        got = []
        for src in range(1, ctx.world_size):
            dist.recv(t, src=src)
            got.append(t.item())
        return sum(got)
    log.append(ctx.rank)
    dist.send(torch.tensor([float(ctx.rank)]), dst=0)
    return 0.0


def test_same_seed_same_results_and_order_under_a_random_schedule() -> None:
    def once(seed: int) -> tuple[list[float], list[int]]:
        log: list[int] = []
        results = simdist.run(
            p2p_race_body,
            world_size=5,
            args=(log,),
            share_args=True,
            schedule="random",
            schedule_seed=seed,
            timeout=TIMEOUT,
        )
        return results, log

    first = once(3)
    assert first[0][0] == 1.0 + 2 + 3 + 4
    assert once(3) == first


# --- store waits give up the token ----------------------------------------------------


def store_body(ctx: simdist.RankContext) -> bytes:
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == ctx.world_size - 1:
        store.set("ready", f"from {ctx.rank}")
    store.wait(["ready"])
    return store.get("ready")


def test_a_store_get_before_the_key_is_set_lets_the_setter_run() -> None:
    # Rank order runs rank 0 first: it blocks in the store until the last rank sets the key.
    assert simdist.run(store_body, world_size=3, timeout=TIMEOUT) == [b"from 2"] * 3


def missing_key_body(ctx: simdist.RankContext) -> None:
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == 0:
        store.get("never set")


def test_a_store_key_nobody_will_set_is_a_deadlock_not_a_timeout() -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(missing_key_body, world_size=2, timeout=TIMEOUT)
    message = str(info.value)
    assert message.startswith("deadlock:")
    assert "rank 0 (rank 0 of 2): waiting in a store wait for key(s)" in message
    assert "never set" in message
    assert "watchdog" not in message


# --- deadlocks and the watchdog under the token ----------------------------------------


def cycle_body(ctx: simdist.RankContext) -> None:
    if ctx.rank < 2:
        dist.send(torch.ones(1), dst=1 - ctx.rank, group=ctx.groups.tp)
    else:
        dist.all_reduce(torch.ones(1), group=ctx.groups.tp)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_partial_cycle_is_found_under_any_schedule(seed: int) -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(
            cycle_body, layout=Layout(tp=2, dp=2), timeout=TIMEOUT, schedule="random", schedule_seed=seed
        )
    message = str(info.value)
    # Whether ranks 2 and 3 are still running then depends on the schedule; the cycle does not.
    assert message.startswith("deadlock: ")
    assert "rank(s) [0, 1] wait for each other in a cycle: 0 -> 1 -> 0" in message
    assert info.value.results[2:] == [None, None]


def spin_body(ctx: simdist.RankContext) -> None:
    dist.barrier()
    if ctx.rank == 1:  # the last to join, so it keeps the token
        while True:
            pass


def test_a_rank_that_never_blocks_is_named_and_the_others_as_starved() -> None:
    with pytest.raises(simdist.SimulationTimeout) as info:
        simdist.run(spin_body, world_size=2, timeout=1.0)
    message = str(info.value)
    assert "watchdog: 1 rank(s) still running" in message
    assert "rank(s) [0] were ready to run, but never got the run token back" in message
    assert "rank 1 (rank 1 of 2):" in message


def test_concurrent_schedule_keeps_the_old_free_running_threads() -> None:
    results = simdist.run(
        lambda ctx: torch.ones(1).add_(ctx.rank), world_size=2, schedule="concurrent", timeout=TIMEOUT
    )
    assert [r.item() for r in results] == [1.0, 2.0]


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(
        ValueError, match="schedule must be one of 'rank', 'random', 'concurrent', got 'fifo'"
    ):
        simdist.run(lambda ctx: None, world_size=2, schedule="fifo")
    with pytest.raises(TypeError, match="schedule_seed must be an int, got str"):
        simdist.run(lambda ctx: None, world_size=2, schedule="random", schedule_seed="1")


# --- the flight record is reproducible too ---------------------------------------------


class _Order(simdist.CommStats):
    """Every call of a run, in the order the ranks started them."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[tuple[int, str, int]] = []

    def add_records(self, records) -> None:  # type: ignore[no-untyped-def]
        self.order = [(r.rank, r.op, r.seq) for r in records]


def mixed_body(ctx: simdist.RankContext) -> None:
    t = torch.ones(2)
    dist.all_reduce(t, group=ctx.groups.tp)
    if ctx.coords.dp == 0:
        dist.send(t, dst=ctx.rank + 2)
    else:
        dist.recv(t, src=ctx.rank - 2)
    dist.barrier()


def call_order(**kwargs: object) -> list[tuple[int, str, int]]:
    with _Order() as order:
        simdist.run(mixed_body, layout=Layout(tp=2, dp=2), timeout=TIMEOUT, **kwargs)
    return order.order


def test_the_order_of_every_call_repeats_under_each_schedule() -> None:
    # Rank order, worked out by hand (tp groups [0, 1] and [2, 3]; dp 0 sends):
    # 0 blocks in its all_reduce; 1 completes it, blocks in send; 0 (lowest
    # runnable) blocks in send; 2 blocks in its all_reduce; 3 completes it,
    # receives 1's send and blocks in the barrier; 1 blocks in the barrier;
    # 2 receives 0's send and blocks in the barrier; 0 completes the barrier.
    want = [
        (0, "all_reduce", 0),
        (1, "all_reduce", 0),
        (1, "send", -1),
        (0, "send", -1),
        (2, "all_reduce", 0),
        (3, "all_reduce", 0),
        (3, "recv", -1),
        (3, "barrier", 0),
        (1, "barrier", 0),
        (2, "recv", -1),
        (2, "barrier", 0),
        (0, "barrier", 0),
    ]
    assert call_order() == want
    assert call_order() == want
    for seed in (1, 2):
        first = call_order(schedule="random", schedule_seed=seed)
        assert call_order(schedule="random", schedule_seed=seed) == first
        assert sorted(first) == sorted(want)


def test_run_queues_skip_ranks_that_stopped_being_runnable() -> None:
    from simdist.policy import RankOrder, SeededRandom

    runnable = {1, 4}
    order = RankOrder()
    for r in (4, 0, 1, 1):
        order.push(r)
    assert order.pick(runnable.__contains__) == 1  # 0 went stale, 1 queued once
    assert order.pick(runnable.__contains__) == 4
    assert order.pick(runnable.__contains__) is None

    def picks(seed: int) -> list[int | None]:
        queue = SeededRandom(seed)
        for r in range(6):
            queue.push(r)
        return [queue.pick(lambda r: r % 2 == 0) for _ in range(4)]

    assert picks(7) == picks(7)
    assert sorted(picks(7)[:3]) == [0, 2, 4] and picks(7)[3] is None
