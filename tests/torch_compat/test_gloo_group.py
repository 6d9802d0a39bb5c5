"""``ProcessGroupGloo(store, rank, size, opts)`` built by hand inside a rank,
with the adapter installed: a simdist group speaking gloo's API. Results are
checked against the maths of each op (an independent reference), errors
against the words PyTorch's test_c10d_gloo.py matches."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import torch_compat

WORLD = 3


def _options() -> object:
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = 30.0
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    return opts


def _group(rank: int) -> dist.ProcessGroup:
    return dist.ProcessGroupGloo(dist.HashStore(), rank, WORLD, _options())


def _value(work: dist.Work) -> list[torch.Tensor]:
    fut = work.get_future()
    fut.wait()
    return fut.value()


def multi_tensor_program(ctx: simdist.RankContext) -> dict[str, object]:
    pg = _group(ctx.rank)
    r = ctx.rank
    # several tensors a rank: reduced over every tensor of every rank
    xs = [torch.tensor([float(r * 2 + i)]) for i in range(2)]
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    maxed = [t.item() for t in _value(pg.allreduce(xs, opts))]
    summed = _value(pg.allreduce(torch.tensor([r + 1.0])))[0].item()  # the single-tensor overload
    # broadcast of root rank 1's second tensor into every tensor of every rank
    bs = [torch.tensor([r * 2.0]), torch.tensor([r * 2.0 + 1])]
    bopts = dist.BroadcastOptions()
    bopts.rootRank, bopts.rootTensor = 1, 1
    broadcast = [t.item() for t in _value(pg.broadcast(bs, bopts))]
    # allgather of two inputs a rank: rank q's input i at q * 2 + i of every list
    ins = [torch.tensor([10 * r + i]) for i in range(2)]
    outs = [[torch.tensor([-1]) for _ in range(2 * WORLD)] for _ in range(2)]
    gathered = [[t.item() for t in lst] for lst in _value(pg.allgather(outs, ins))]
    # one tensor passed twice to a coalesced all_reduce is summed once
    t = torch.tensor([r + 1.0])
    coalesced = [x.item() for x in _value(pg.allreduce_coalesced([t, t]))]
    return {
        "max": maxed,
        "sum": summed,
        "broadcast": broadcast,
        "gathered": gathered,
        "coalesced": coalesced,
        "name": pg.name(),
    }


def test_hand_built_gloo_group_runs_gloos_multi_tensor_forms(compat: None) -> None:
    results = simdist.run(multi_tensor_program, world_size=WORLD, timeout=60)
    total = sum(r + 1.0 for r in range(WORLD))
    for res in results:
        assert res["max"] == [float(2 * (WORLD - 1) + 1)] * 2
        assert res["sum"] == total
        assert res["broadcast"] == [3.0, 3.0]
        assert res["gathered"] == [[10 * q + i for q in range(WORLD) for i in range(2)]] * 2
        assert res["coalesced"] == [total, total]
        assert res["name"] == "gloo"


def checks_program(ctx: simdist.RankContext) -> list[str]:
    pg = _group(ctx.rank)
    t1 = torch.zeros([1])
    t2 = torch.zeros([1], dtype=torch.float64)
    t3 = torch.zeros([2])
    said = []

    def refused(fn: object) -> None:
        with pytest.raises(RuntimeError) as info:
            fn()  # type: ignore[operator]
        said.append(str(info.value))

    bad_root = dist.BroadcastOptions()
    bad_root.rootRank = WORLD
    refused(lambda: pg.broadcast([t1], bad_root))
    refused(lambda: pg.allreduce([], dist.AllreduceOptions()))
    refused(lambda: pg.allreduce([t1, t2]))
    refused(lambda: pg.allreduce([t1, t3]))
    refused(lambda: pg.allgather([[t1] * (WORLD - 1)], [t1]))
    sopts = dist.ScatterOptions()
    sopts.rootRank = (ctx.rank + 1) % WORLD
    refused(lambda: pg.scatter([t1], [[t1] * WORLD], sopts))
    # and the group still works after every refusal, on every rank
    said.append(str(_value(pg.allreduce(torch.ones(2)))[0].tolist()))
    return said


def test_gloo_checks_refuse_on_the_rank_in_gloos_words(compat: None) -> None:
    for said in simdist.run(checks_program, world_size=WORLD, timeout=60):
        assert "invalid root rank" in said[0]
        assert "requires non-empty tensor list" in said[1]
        assert "invalid tensor type" in said[2]
        assert "invalid tensor size" in said[3]
        assert "invalid output tensor list" in said[4]
        assert "requires empty input on non-root" in said[5]
        assert said[6] == str([float(WORLD)] * 2)


def test_outside_a_rank_it_is_torchs_class(compat: None) -> None:
    assert dist.ProcessGroupGloo._Options is torch_compat.gloo._REAL._Options
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, _options())
    assert isinstance(pg, torch_compat.gloo._REAL)
    assert isinstance(pg, dist.ProcessGroupGloo)


def mismatched_program(ctx: simdist.RankContext) -> None:
    dist.ProcessGroupGloo(dist.HashStore(), 0, WORLD, _options())


def test_a_rank_building_another_ranks_group_is_told(compat: None) -> None:
    with pytest.raises(simdist.RankError, match="each rank with its own rank"):
        simdist.run(mismatched_program, world_size=WORLD, timeout=60)


def test_uninstall_puts_torchs_class_back(compat: None) -> None:
    torch_compat.uninstall()
    try:
        assert dist.ProcessGroupGloo is torch_compat.gloo._REAL
    finally:
        torch_compat.install()
