"""A rank that busy-polls the world's store (``add(key, 0)`` or ``check`` in
a loop, as hand-written store barriers do) waits for the store to change
after a few polls that found nothing new: otherwise it keeps the run token
and the peers it polls for never run (the run hung until its timeout). A
poll that nothing will ever answer is a deadlock, reported at once."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import simdist

WORLD = 4


def polling_barrier(ctx: simdist.RankContext) -> int:
    store = dist.distributed_c10d._get_default_store()
    key = "poll-barrier"
    if ctx.rank == 0:
        polls = 0
        while store.add(key, 0) < ctx.world_size - 1:
            polls += 1
        return polls
    store.add(key, 1)
    return -1


def test_a_busy_polling_rank_lets_its_peers_run() -> None:
    results = simdist.run(polling_barrier, world_size=WORLD, timeout=30)
    assert results[1:] == [-1] * (WORLD - 1)
    # rank 0 polled a bounded number of times (waits between changes)
    assert 0 <= results[0] <= 3 * WORLD


def check_loop(ctx: simdist.RankContext) -> bool:
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == 1:
        store.set("ready", "1")
        return True
    while not store.check(["ready"]):
        pass
    return True


def test_a_check_loop_sees_the_key_a_peer_sets() -> None:
    assert simdist.run(check_loop, world_size=2, timeout=30) == [True, True]


def polls_forever(ctx: simdist.RankContext) -> None:
    store = dist.distributed_c10d._get_default_store()
    while store.add("never", 0) < 1:
        pass


def test_a_poll_nobody_answers_is_a_deadlock_not_a_hang() -> None:
    with pytest.raises(simdist.DeadlockError, match="store poll"):
        simdist.run(polls_forever, world_size=2, timeout=30)


def reads_several_missing_keys(ctx: simdist.RankContext) -> list[bool]:
    store = dist.distributed_c10d._get_default_store()
    # one look at each of several optional keys nobody sets: no loop, so no wait
    found = [store.check([f"optional-{i}"]) for i in range(6)]
    found += [store.add(f"counter-{i}", 0) > 0 for i in range(6)]
    return found


def test_reads_of_different_keys_are_not_a_poll() -> None:
    assert simdist.run(reads_several_missing_keys, world_size=2, timeout=30) == [[False] * 12] * 2
