"""c10d isolation is scoped to a run's threads: a real world used by name in
another thread keeps working during and after a run, a rank can only remove
its own groups, and a rank thread that outlives its run (blocked in C)
disturbs neither the caller nor a later run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d

import simdist
import simdist._run.watchdog
from simdist import Layout

TIMEOUT = 60.0


@pytest.fixture
def real_world() -> Iterator[dist.ProcessGroup]:
    """The caller's own one-rank gloo world, registered as group "0"."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def use_real_world_by_name(expected: dist.ProcessGroup) -> list[float]:
    """What a thread outside any run does with the caller's world: resolve it
    by its registry name, run a functional collective by name, and a plain one."""
    assert c10d._resolve_process_group("0") is expected
    by_name = funcol.all_reduce(torch.tensor([2.0]), "sum", "0").wait()
    plain = torch.tensor([3.0])
    dist.all_reduce(plain)
    assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 1
    return by_name.tolist() + plain.tolist()


def test_a_real_world_used_by_name_in_another_thread_during_and_after_a_run(
    real_world: dist.ProcessGroup,
) -> None:
    inside, outside_done = threading.Event(), threading.Event()
    seen: list[Any] = []

    def outsider() -> None:
        try:
            inside.wait(30)
            seen.append(use_real_world_by_name(real_world))
        except BaseException as exc:  # reported by the assertion below
            seen.append(exc)
        finally:
            outside_done.set()

    def body(ctx: simdist.RankContext, inside: threading.Event, done: threading.Event) -> int:
        t = torch.ones(1)
        dist.all_reduce(t)
        if ctx.rank == 0:
            inside.set()  # the outsider works while this run is in progress
            assert done.wait(30)
        dist.all_reduce(t)
        return int(t.item())

    thread = threading.Thread(target=outsider)
    thread.start()
    results = simdist.run(body, world_size=2, timeout=TIMEOUT, args=(inside, outside_done), share_args=True)
    thread.join(30)
    assert results == [4, 4]
    assert seen == [[2.0, 3.0]]
    assert use_real_world_by_name(real_world) == [2.0, 3.0]


def names_body(ctx: simdist.RankContext) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for axis in ("world", "tp", "dp"):
        g = ctx.groups[axis]
        assert c10d._resolve_process_group(g.group_name) is g  # its own rank's group
        t = torch.tensor([float(ctx.rank)])
        out[axis] = (g.group_name, funcol.all_reduce(t, "sum", g.group_name).wait().item())
    return out


def test_each_ranks_groups_resolve_by_name_to_its_own_group() -> None:
    layout = Layout(tp=2, dp=2)
    results = simdist.run(names_body, layout=layout, timeout=TIMEOUT)
    names = [name for r in results for name, _ in r.values()]
    assert len(set(names)) == len(names), f"registry names are not unique: {names}"
    for rank, r in enumerate(results):
        for axis in ("world", "tp", "dp"):
            expected = float(sum(layout.group_of(axis, rank)))
            assert r[axis][1] == expected, (rank, axis)
    # Nothing of the run is left in the registry.
    for name in names:
        with pytest.raises(Exception):
            c10d._resolve_process_group(name)


def destroy_then_peers_go_on_body(ctx: simdist.RankContext, destroyed: threading.Event) -> float:
    pair = dist.new_group([0, 2])
    dist.barrier()
    if ctx.rank == 1:
        dist.destroy_process_group()  # wipes c10d's registry: only its own names may go
        destroyed.set()
        return -1.0
    assert destroyed.wait(30)
    assert c10d._resolve_process_group(pair.group_name) is pair
    assert c10d._resolve_process_group(dist.group.WORLD.group_name) is dist.group.WORLD
    return funcol.all_reduce(torch.tensor([1.0 + ctx.rank]), "sum", pair.group_name).wait().item()


def test_a_rank_destroying_its_world_removes_only_its_own_groups(real_world: dist.ProcessGroup) -> None:
    results = simdist.run(
        destroy_then_peers_go_on_body,
        world_size=3,
        timeout=TIMEOUT,
        schedule="concurrent",
        args=(threading.Event(),),
        share_args=True,
    )
    assert results == [4.0, -1.0, 4.0]
    assert use_real_world_by_name(real_world) == [2.0, 3.0]


def blocked_in_c_body(ctx: simdist.RankContext, blocker: threading.Event) -> int:
    dist.barrier()
    if ctx.rank == 1:
        blocker.wait()  # blocks in C: no interrupt reaches it
    return ctx.rank


def later_run_body(
    ctx: simdist.RankContext, blocker: threading.Event, leftover: list[threading.Thread]
) -> list[Any]:
    world = dist.group.WORLD
    if ctx.rank == 0:
        blocker.set()  # the earlier run's leftover rank now returns and cleans up
        leftover[0].join(30)
        assert not leftover[0].is_alive()
    t = torch.tensor([1.0 + ctx.rank])
    dist.all_reduce(t)
    assert c10d._resolve_process_group(world.group_name) is world
    return [t.item(), funcol.all_reduce(torch.ones(1), "sum", world.group_name).wait().item()]


def test_a_rank_blocked_in_c_is_reported_and_disturbs_nothing_when_it_exits_late(
    real_world: dist.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(simdist._run.watchdog, "GRACE_S", 0.5)
    blocker = threading.Event()
    before = set(threading.enumerate())
    with pytest.raises(simdist.SimulationTimeout) as info:
        simdist.run(blocked_in_c_body, world_size=2, timeout=1.0, args=(blocker,), share_args=True)
    report = str(info.value)
    assert "could not be interrupted" in report and "simdist-rank-1" in report
    assert "in blocked_in_c_body" in report  # its stack
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert [t.name for t in leftover] == ["simdist-rank-1"]
    # The caller's world works while the leftover is still blocked.
    assert use_real_world_by_name(real_world) == [2.0, 3.0]
    assert dist.group.WORLD is real_world
    # A later run releases it: its exit must not remove that run's groups.
    results = simdist.run(
        later_run_body, world_size=2, timeout=TIMEOUT, args=(blocker, leftover), share_args=True
    )
    assert results == [[3.0, 2.0], [3.0, 2.0]]
    assert use_real_world_by_name(real_world) == [2.0, 3.0]
    assert type(c10d._world) is c10d._World, "routing ends once the last rank thread has left"


def drawing_body(ctx: simdist.RankContext, base: int, rounds: int) -> tuple[list[float], str]:
    torch.manual_seed(base + ctx.rank)
    draws: list[float] = []
    for _ in range(rounds):
        draws += torch.randn(2).tolist()
        t = torch.ones(1)
        dist.all_reduce(t)  # the token passes here, to this run's ranks or another run's
    return draws, dist.group.WORLD.group_name


def expected_draws(seed: int, rounds: int) -> list[float]:
    g = torch.Generator().manual_seed(seed)
    return [x for _ in range(rounds) for x in torch.randn(2, generator=g).tolist()]


@pytest.mark.parametrize("schedule", ["rank", "random"])
def test_runs_in_several_threads_at_once_stay_independent(schedule: str) -> None:
    torch.manual_seed(11)
    caller_state = torch.get_rng_state()
    rounds, bases = 20, [100, 200, 300]
    outcomes: dict[int, Any] = {}

    def one(base: int) -> None:
        try:
            outcomes[base] = simdist.run(
                drawing_body, world_size=3, timeout=TIMEOUT, schedule=schedule, args=(base, rounds)
            )
        except BaseException as exc:  # reported below
            outcomes[base] = exc

    threads = [threading.Thread(target=one, args=(b,)) for b in bases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    names = []
    for base in bases:
        results = outcomes[base]
        assert not isinstance(results, BaseException), results
        for rank, (draws, name) in enumerate(results):
            assert draws == expected_draws(base + rank, rounds), (base, rank)
            names.append(name)
    assert len(set(names)) == len(names)
    assert torch.equal(torch.get_rng_state(), caller_state), "the caller's generator is put back"


def inner_body(ctx: simdist.RankContext) -> list[float]:
    torch.manual_seed(50 + ctx.rank)
    t = torch.ones(1)
    dist.all_reduce(t)
    return [t.item()] + torch.rand(1).tolist()


def outer_body(ctx: simdist.RankContext) -> list[Any]:
    torch.manual_seed(ctx.rank)
    first = torch.rand(1).tolist()
    t = torch.ones(1)
    dist.all_reduce(t)
    inner = simdist.run(inner_body, world_size=2, timeout=TIMEOUT) if ctx.rank == 0 else None
    second = torch.rand(1).tolist()  # the rank's own generator, as before the inner run
    dist.all_reduce(t)
    return [first + second, inner, dist.get_rank(), t.item()]


def test_a_run_started_inside_a_rank_runs_and_leaves_the_ranks_state_alone() -> None:
    results = simdist.run(outer_body, world_size=2, timeout=TIMEOUT)
    for rank, (draws, _inner, rank_seen, total) in enumerate(results):
        assert draws == torch.rand(2, generator=torch.Generator().manual_seed(rank)).tolist()
        assert rank_seen == rank and total == 4.0
    assert results[0][1] == [
        [2.0] + torch.rand(1, generator=torch.Generator().manual_seed(50 + r)).tolist() for r in range(2)
    ]
