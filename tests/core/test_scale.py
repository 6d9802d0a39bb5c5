"""Large worlds give the same answers as small ones.

The 1024-rank step is in the nightly profile (``slow``); what it asserts is
correctness against a reference computed here from numpy alone, never time
(timings live in benchmarks/scale.py). The fast tests pin down what the
start-up and scaling changes rely on: every rank thread starts once, a start
the OS refuses is reported, a rank that leaves while peers wait on it is found
through the scheduler's indexes, and c10d's world rank map is right.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout
from simdist._core.pool import StartFailed, ThreadStart

TIMEOUT = 600.0


def reference_groups(layout: Layout, axis: str) -> dict[int, list[int]]:
    """Each rank's group along ``axis`` from a numpy reshape (Megatron order:
    tp fastest, then cp, dp, pp), independent of simdist.Layout's arithmetic."""
    grid = np.arange(layout.world_size).reshape(layout.pp, layout.dp, layout.cp, layout.tp)
    dim = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}[axis]
    moved = np.moveaxis(grid, dim, -1).reshape(-1, grid.shape[dim])
    return {int(r): sorted(int(x) for x in row) for row in moved for r in row}


def step_body(ctx: simdist.RankContext) -> tuple[float, float, float, list[list[int]]]:
    """tp all_reduce, dp all_reduce, then even pp stages send to the next stage."""
    t = torch.full((3,), float(ctx.rank), dtype=torch.float64)
    dist.all_reduce(t, group=ctx.groups.tp)
    after_tp = float(t[0])
    dist.all_reduce(t, group=ctx.groups.dp)
    after_dp = float(t[1])
    stage, stages = ctx.coords.pp, ctx.layout.pp
    if stage % 2 == 0 and stage + 1 < stages:
        dist.send(t, group_dst=stage + 1, group=ctx.groups.pp)
    elif stage % 2 == 1:
        dist.recv(t, group_src=stage - 1, group=ctx.groups.pp)
    groups = [dist.get_process_group_ranks(ctx.groups[a]) for a in ("tp", "dp", "pp")]
    return after_tp, after_dp, float(t[2]), groups


def check_step(layout: Layout, results: list[tuple[float, float, float, list[list[int]]]]) -> None:
    tp, dp, pp = (reference_groups(layout, a) for a in ("tp", "dp", "pp"))
    after_tp = {r: float(sum(tp[r])) for r in range(layout.world_size)}
    after_dp = {r: sum(after_tp[m] for m in dp[r]) for r in range(layout.world_size)}
    for rank, (got_tp, got_dp, got_pp, groups) in enumerate(results):
        assert groups == [tp[rank], dp[rank], pp[rank]], rank
        assert got_tp == after_tp[rank], rank
        assert got_dp == after_dp[rank], rank
        stage = layout.coords(rank).pp
        sender = rank - layout.tp * layout.cp * layout.dp if stage % 2 == 1 else rank
        assert got_pp == after_dp[sender], rank


def test_a_small_step_matches_the_reference() -> None:
    layout = Layout(tp=2, dp=2, pp=4)
    check_step(layout, simdist.run(step_body, layout=layout, timeout=TIMEOUT))


@pytest.mark.slow
def test_a_1024_rank_step_matches_the_reference() -> None:
    layout = Layout(tp=8, dp=16, pp=8)
    check_step(layout, simdist.run(step_body, layout=layout, timeout=TIMEOUT))


@pytest.mark.slow
def test_1024_ranks_that_each_create_every_group_get_the_right_ones() -> None:
    """Megatron's parallel_state pattern: every rank calls new_group for every
    group (non-members included) in the same order."""
    layout = Layout(tp=8, dp=16, pp=8)

    def body(ctx: simdist.RankContext) -> list[list[int]]:
        mine = []
        for axis in ("tp", "dp", "pp"):
            for ranks in ctx.layout.group_ranks(axis):
                group = dist.new_group(ranks)
                if ctx.rank in ranks:
                    mine.append(dist.get_process_group_ranks(group))
                    t = torch.ones(1)
                    dist.all_reduce(t, group=group)
                    mine.append([int(t.item())])
                else:
                    assert group == dist.GroupMember.NON_GROUP_MEMBER
        return mine

    results = simdist.run(body, layout=layout, timeout=TIMEOUT)
    refs = [reference_groups(layout, a) for a in ("tp", "dp", "pp")]
    for rank, got in enumerate(results):
        expected = []
        for ref in refs:
            expected += [ref[rank], [len(ref[rank])]]
        assert got == expected, rank


@pytest.mark.parametrize("n", [1, 2, 37])
def test_thread_start_runs_every_thread_once(n: int) -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def target(i: int) -> None:
        with lock:
            ran.append(i)

    starter = ThreadStart(n, target, lambda i: f"t{i}")
    starter.start()
    for t in starter.threads:
        t.join(10)
    assert sorted(ran) == list(range(n))


def test_a_thread_the_os_refuses_is_reported() -> None:
    gate = threading.Event()
    starter = ThreadStart(6, lambda i: gate.wait(10), lambda i: f"t{i}")

    def refuse() -> None:
        raise RuntimeError("can't start new thread")

    starter.threads[5].start = refuse  # type: ignore[method-assign]
    with pytest.raises(StartFailed, match="can't start new thread"):
        starter.start()
    gate.set()
    for t in starter.threads[:5]:
        if t.ident is not None:
            t.join(10)


def leave_chain_body(ctx: simdist.RankContext) -> None:
    """Rank 0 waits on rank 5, which returns without joining; rank 1 waits on
    rank 0 and rank 2 on rank 1: only ranks that need the leaver are stuck
    (rank 4 still runs when rank 5 leaves: no "every rank waits" shortcut)."""
    t = torch.ones(1)
    if ctx.rank in (0, 5):
        group = dist.new_group([0, 5], use_local_synchronization=True)
        if ctx.rank == 0:
            dist.all_reduce(t, group=group)
        else:  # wakes rank 4, so that a rank still runs when this one leaves
            dist.send(t, dst=4)
    elif ctx.rank == 4:
        dist.recv(t, src=5)
    elif ctx.rank == 1:
        dist.recv(t, src=0)
    elif ctx.rank == 2:
        dist.recv(t, src=1)


@pytest.mark.parametrize("schedule,seed", [("rank", 0), ("random", 1), ("random", 2), ("random", 3)])
def test_a_rank_that_leaves_while_peers_wait_on_it_is_a_deadlock(schedule: str, seed: int) -> None:
    with pytest.raises(simdist.DeadlockError) as info:
        simdist.run(leave_chain_body, world_size=6, schedule=schedule, schedule_seed=seed, timeout=TIMEOUT)
    message = str(info.value)
    assert re.search(
        r"  rank 0 \(rank 0 of 6\): waiting in all_reduce on group \w+ \[0, 5\] seq 0; "
        r"still missing rank\(s\) \[5\]\n",
        message,
    ), message
    assert "  rank 5 (rank 5 of 6): finished\n" in message
    if schedule == "rank":  # 0, 1, 2 wait, 3 returns, 4 waits, 5 wakes 4 and leaves
        assert "deadlock: rank(s) [0] wait on a peer that has already finished" in message
    assert info.value.results[3] is None and info.value.results[4] is None  # type: ignore[attr-defined]


def test_the_world_rank_map_is_the_identity_on_every_rank() -> None:
    def body(ctx: simdist.RankContext) -> tuple[list[int], list[int]]:
        world = dist.group.WORLD
        return (
            dist.get_process_group_ranks(world),
            [dist.get_global_rank(world, r) for r in range(ctx.world_size)],
        )

    for got in simdist.run(body, world_size=5, timeout=TIMEOUT):
        assert got == (list(range(5)), list(range(5)))


def gauss_body(ctx: simdist.RankContext) -> list[float]:
    """Draws that leave a cached Gaussian behind (random.gauss, numpy's legacy
    normal), interleaved with switches to ranks that draw too."""
    import random

    random.seed(100 + ctx.rank)
    np.random.seed(200 + ctx.rank)
    torch.manual_seed(300 + ctx.rank)
    out = []
    for _ in range(3):
        out += [random.gauss(0, 1), float(np.random.normal()), float(torch.randn(1))]
        dist.barrier()
    return out


def test_cached_gaussians_survive_state_swaps() -> None:
    import random

    def alone(rank: int) -> list[float]:  # what a process of its own draws
        py, npr, gen = random.Random(100 + rank), np.random.RandomState(200 + rank), torch.Generator()
        gen.manual_seed(300 + rank)
        out = []
        for _ in range(3):
            out += [py.gauss(0, 1), float(npr.normal()), float(torch.randn(1, generator=gen))]
        return out

    for schedule, seed in (("rank", 0), ("random", 4)):
        results = simdist.run(gauss_body, world_size=4, schedule=schedule, schedule_seed=seed)
        assert results == [alone(r) for r in range(4)]


def store_barrier_body(ctx: simdist.RankContext) -> int:
    from datetime import timedelta

    from torch.distributed.distributed_c10d import _get_default_store, _store_based_barrier

    store = _get_default_store()
    _store_based_barrier(ctx.rank, store, "scale-test", ctx.world_size, timedelta(seconds=60))
    return store.add("store_based_barrier_key:scale-test", 0)


def test_a_store_based_barrier_of_many_ranks_completes() -> None:
    assert simdist.run(store_barrier_body, world_size=64, timeout=TIMEOUT) == [64] * 64


def store_keys_body(ctx: simdist.RankContext) -> list[bytes] | None:
    store = dist.distributed_c10d._get_default_store()
    if ctx.rank == 0:  # waits for both keys present at once
        return store.multi_get(["a", "b"])
    if ctx.rank == 1:
        store.set("a", "a1")  # "b" is still missing: rank 0 must keep waiting
        dist.recv(torch.zeros(1), src=2)  # gives up the token (rank 0 first, if it were runnable)
        store.set("b", "b1")
    if ctx.rank == 2:
        dist.send(torch.zeros(1), dst=1)
    return None


def test_a_store_wait_on_several_keys_needs_all_of_them_at_once() -> None:
    assert simdist.run(store_keys_body, world_size=3, timeout=TIMEOUT)[0] == [b"a1", b"b1"]
