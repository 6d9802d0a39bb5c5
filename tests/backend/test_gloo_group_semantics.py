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
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=7), pg)
    seen = [pg.options._timeout.total_seconds()]
    pg.set_timeout(datetime.timedelta(seconds=9))
    seen.append(pg._get_backend(torch.device("cpu")).options._timeout.total_seconds())
    if ctx.rank == 0:  # alone: the wait can never complete, and times out as gloo's
        with pytest.raises(RuntimeError, match="Timed out waiting 9000ms"):
            pg.allreduce([torch.ones(1)]).wait()
    return seen


def test_a_groups_timeout_set_after_creation_is_its_waits() -> None:
    """c10d's _set_pg_timeout and the group's set_timeout change the timeout
    of the group's later waits (and ``options._timeout``), as on gloo."""
    assert simdist.run(set_pg_timeout, world_size=WORLD, timeout=60.0) == [[7.0, 9.0]] * WORLD


def flight_recorder_dump(ctx: simdist.RankContext) -> None:
    a = torch.ones(3, 4)
    for _ in range(3):
        dist.all_reduce(a)


def _recorded() -> list[object]:
    dump = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True)
    return list(json.loads(dump).get("entries") or [])


def test_torchs_flight_recorder_sees_no_simdist_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's C++ flight recorder (TORCH_FR_BUFFER_SIZE, ``_dump_fr_trace``)
    records what gloo's and NCCL's C++ backends issue; simdist's calls go to
    simdist's own recorder (the ``last calls per rank`` of its reports). The
    recorder is process-wide: other tests' real gloo groups may have left
    entries, which stay exactly as they were."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "10")
    before = _recorded()
    simdist.run(flight_recorder_dump, world_size=2, timeout=60.0)
    assert _recorded() == before


def uneven_reduce_scatter(ctx: simdist.RankContext) -> list[float]:
    r = dist.get_rank()
    inputs = [torch.arange(float(i)) * (r + 1) for i in range(WORLD)]  # entry i: member i's size
    out = torch.empty(r)
    dist.reduce_scatter(out, inputs)
    return out.tolist()


def test_reduce_scatter_entries_of_each_members_shape_match_a_gloo_world() -> None:
    gloo = run_processes(uneven_reduce_scatter, world_size=WORLD, backend="gloo", timeout=120.0)
    sim = simdist.run(uneven_reduce_scatter, world_size=WORLD, timeout=60.0)
    assert sim == gloo
    assert sim[2] == [0.0, 6.0]  # (1 + 2 + 3) x arange(2)


def uneven_shapes_disagree(ctx: simdist.RankContext) -> None:
    sizes = [1, 2] if dist.get_rank() == 0 else [1, 3]  # members list different shapes
    out = torch.empty(sizes[dist.get_rank()])
    dist.reduce_scatter(out, [torch.ones(n) for n in sizes])


def test_members_listing_different_entry_shapes_is_a_mismatch() -> None:
    with pytest.raises(simdist.CollectiveMismatchError):
        simdist.run(uneven_shapes_disagree, world_size=2, timeout=60.0)


@pytest.mark.parametrize(
    ("world", "numel", "dtype"), [(4, 2000, torch.float16), (3, 1001, torch.float32), (2, 7, torch.bfloat16)]
)
def test_the_gloo_reduction_model_is_gloos_all_reduce_bitwise(
    world: int, numel: int, dtype: torch.dtype
) -> None:
    """reduction="gloo" sums in gloo's ring order: bitwise a gloo world's result."""
    gloo = run_processes(
        low_precision_sum, world_size=world, backend="gloo", timeout=120.0, args=(numel, dtype)
    )
    sim = simdist.run(
        low_precision_sum, world_size=world, timeout=60.0, reduction="gloo", args=(numel, dtype)
    )
    assert all(torch.equal(s, g) for s, g in zip(sim, gloo, strict=True))


def low_precision_sum(ctx: simdist.RankContext, numel: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(500 + dist.get_rank())
    t = ((torch.rand(numel, generator=g) * 2 - 1) * 60000 / ctx.world_size).to(dtype)
    dist.all_reduce(t)
    return t
