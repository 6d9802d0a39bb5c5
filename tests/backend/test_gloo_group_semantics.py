"""What a gloo group does that simdist's groups now do too, each compared
with a real gloo world running the same program: a tensor passed twice to a
coalesced all_reduce is reduced once (gloo packs the tensors into one buffer
first); a waited barrier completes the rank's earlier collectives on its
group (gloo's barrier waits for them), so reading their buffers after it is
not a race; ``pg.name()`` and ``_get_backend(device)`` answer as c10d does."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import run_processes

WORLD = 3


def program(ctx: simdist.RankContext) -> list[object]:
    r = dist.get_rank()
    pg = dist.new_group(list(range(WORLD)), backend="gloo")
    t = torch.tensor([r + 1.0])
    dist.all_reduce_coalesced([t, t], group=pg)
    once = t.tolist()
    u, v = torch.tensor([r + 1.0, 2.0]), torch.tensor([3.0 * r])
    dist.all_reduce_coalesced([u, v, u], group=pg)
    mixed = u.tolist() + v.tolist()
    # unwaited all_reduces, then a barrier: their results are there after it
    xs = [torch.full((4,), float(i + r)) for i in range(3)]
    for x in xs:
        dist.all_reduce(x, group=pg, async_op=True)
    dist.barrier(group=pg)
    after = [x.tolist() for x in xs]
    return [once, mixed, after, pg.name(), pg._get_backend(torch.device("cpu")) is not None]


def test_gloo_group_semantics_match_a_gloo_world() -> None:
    gloo = run_processes(program, world_size=WORLD, backend="gloo", timeout=120.0)
    sim = simdist.run(program, world_size=WORLD, timeout=60.0)
    assert sim == gloo
    total = sum(r + 1.0 for r in range(WORLD))
    assert sim[0][0] == [total]  # reduced once, not twice


def barrier_on_another_group(ctx: simdist.RankContext) -> None:
    other = dist.new_group(list(range(WORLD)))
    x = torch.ones(4)
    dist.all_reduce(x, async_op=True)  # on the world group
    dist.barrier(group=other)  # waits for the other group's work only
    x.add_(1)  # so this still races with the all_reduce


def test_a_barrier_on_another_group_completes_nothing_here() -> None:
    with pytest.raises(simdist.RankError, match="AsyncRaceError"):
        simdist.run(barrier_on_another_group, world_size=WORLD, timeout=60.0)
