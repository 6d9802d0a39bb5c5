"""What a gloo group does that simdist's groups now do too, each compared
with a real gloo world running the same program: a tensor passed twice to a
coalesced all_reduce is reduced once (gloo packs the tensors into one buffer
first); a waited barrier completes the rank's earlier collectives on its
group (gloo's barrier waits for them), so reading their buffers after it is
not a race; ``pg.name()`` and ``_get_backend(device)`` answer as c10d does."""

from __future__ import annotations

import datetime
import json

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


def float16_sum(ctx: simdist.RankContext) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + dist.get_rank())
    t = ((torch.rand(2000, generator=g) * 2 - 1) * 65504 / 4).to(torch.float16)
    dist.all_reduce(t)
    return t


def test_float16_sums_differ_from_gloos_order_within_roundings() -> None:
    """gloo adds float16 all_reduce chunks in an order of its own (not rank
    order, nor simdist's ring or tree: measured); simdist's sum is within the
    roundings of a four-term float16 sum of it, not bitwise equal."""
    gloo = run_processes(float16_sum, world_size=4, backend="gloo", timeout=120.0)[0]
    sim = simdist.run(float16_sum, world_size=4, timeout=60.0)[0]
    assert not torch.equal(sim, gloo)
    # three additions, each within half an ulp of a partial sum of at most 4 x 16376
    ulp = torch.finfo(torch.float16).eps * 4 * 16376
    assert (sim.float() - gloo.float()).abs().max().item() <= 3 * ulp


def set_pg_timeout(ctx: simdist.RankContext) -> list[object]:
    pg = dist.new_group(list(range(WORLD)), backend="gloo")
    with pytest.warns(UserWarning, match="only supported for either nccl or gloo"):
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=7), pg)
    pg.set_timeout(datetime.timedelta(seconds=9))  # the group's own method works
    return [pg.options._timeout.total_seconds()]


def test_set_pg_timeout_reaches_no_simdist_group() -> None:
    """c10d's _set_pg_timeout acts on a group's gloo or NCCL backend objects,
    which a simdist group does not have: it warns and changes nothing (gloo: the
    backend's timeout); ``pg.set_timeout`` does set it."""
    assert simdist.run(set_pg_timeout, world_size=WORLD, timeout=60.0) == [[9.0]] * WORLD


def flight_recorder_dump(ctx: simdist.RankContext) -> dict[str, object]:
    a = torch.ones(3, 4)
    dist.all_reduce(a)
    dump = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True)
    return json.loads(dump)


def test_torchs_flight_recorder_sees_no_simdist_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's C++ flight recorder (TORCH_FR_BUFFER_SIZE, ``_dump_fr_trace``)
    records what gloo's and NCCL's C++ backends issue; simdist's calls go to
    simdist's own recorder (the ``last calls per rank`` of its reports)."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    for dump in simdist.run(flight_recorder_dump, world_size=2, timeout=60.0):
        assert not dump.get("entries") and not dump.get("pg_config")
