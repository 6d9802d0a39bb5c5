"""The process group's argument checks, called on the group itself (past torch's
own checks), pin their wording: which op, which argument, what was expected,
what came. Also the coalesced gather/scatter forms against values built here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist

F32 = torch.ones(4)
F64 = torch.ones(4, dtype=torch.float64)
MIXED = "real backends (gloo, NCCL) refuse mixed dtypes: cast one of them"


def _opts(kind: Callable[[], Any], **fields: Any) -> Any:
    opts = kind()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _rs() -> Any:
    return dist.ReduceScatterOptions()


# (id, who calls (None: every rank), the call on (group, this rank), the exact ValueError message)
VALUE_ERRORS: list[tuple[str, int | None, Callable[[Any, int], Any], str]] = [
    (
        "all_gather list length",
        None,
        lambda pg, r: pg.allgather([[F32.clone()]], [F32]),
        "all_gather: tensor_list has 1 tensors, expected group size 2",
    ),
    (
        "all_gather list dtype",
        None,
        lambda pg, r: pg.allgather([[F32.clone(), F64.clone()]], [F32]),
        f"all_gather: tensor_list[1] has dtype torch.float64 but tensor has dtype torch.float32; {MIXED}",
    ),
    (
        "reduce_scatter list length",
        None,
        lambda pg, r: pg.reduce_scatter([F32.clone()], [[F32]], _rs()),
        "reduce_scatter: input_list has 1 tensors, expected group size 2",
    ),
    (
        "reduce_scatter list dtype",
        None,
        lambda pg, r: pg.reduce_scatter([F32.clone()], [[F32, F64]], _rs()),
        f"reduce_scatter: output has dtype torch.float32 but input_list[1] has dtype torch.float64; {MIXED}",
    ),
    (
        # Entry r is member r's: only the rank's own entry must have its output's shape.
        "reduce_scatter own entry shape",
        None,
        lambda pg, r: pg.reduce_scatter([F32.clone()], [[torch.ones(3), torch.ones(3)]], _rs()),
        "reduce_scatter: input_list[{rank}] has shape [3], expected the output shape [4]",
    ),
    (
        # Every entry's dtype is checked before the rank's own entry's shape.
        "reduce_scatter checks dtypes before its own shape",
        None,
        lambda pg, r: pg.reduce_scatter([F32.clone()], [[torch.ones(3), F64]], _rs()),
        f"reduce_scatter: output has dtype torch.float32 but input_list[1] has dtype torch.float64; {MIXED}",
    ),
    (
        "gather root list length",
        0,
        lambda pg, r: pg.gather([[F32.clone()]], [F32], _opts(dist.GatherOptions, rootRank=0)),
        "gather: gather_list has 1 tensors, expected group size 2",
    ),
    (
        "gather root list dtype",
        1,
        lambda pg, r: pg.gather([[F32.clone(), F64.clone()]], [F32], _opts(dist.GatherOptions, rootRank=1)),
        f"gather: gather_list[1] has dtype torch.float64 but tensor has dtype torch.float32; {MIXED}",
    ),
    (
        "gather root outside the group",
        None,
        lambda pg, r: pg.gather([], [F32], _opts(dist.GatherOptions, rootRank=2)),
        "gather: root group rank 2 is outside the group of size 2",
    ),
    (
        "scatter root list length",
        0,
        lambda pg, r: pg.scatter([F32.clone()], [[F32]], _opts(dist.ScatterOptions, rootRank=0)),
        "scatter: scatter_list has 1 tensors, expected group size 2",
    ),
    (
        "scatter root list dtype",
        1,
        lambda pg, r: pg.scatter([F32.clone()], [[F32, F64]], _opts(dist.ScatterOptions, rootRank=1)),
        f"scatter: tensor has dtype torch.float32 but scatter_list[1] has dtype torch.float64; {MIXED}",
    ),
    (
        "scatter root outside the group",
        None,
        lambda pg, r: pg.scatter([F32.clone()], [], _opts(dist.ScatterOptions, rootRank=-1)),
        "scatter: root group rank -1 is outside the group of size 2",
    ),
    (
        "all_gather_into_tensor size",
        None,
        lambda pg, r: pg.all_gather_single(torch.ones(5), F32),
        "all_gather_into_tensor: output_tensor has 5 elements, expected group size 2 * input numel 4 = 8",
    ),
    (
        "all_gather_into_tensor dtype",
        None,
        lambda pg, r: pg.all_gather_single(torch.ones(8, dtype=torch.float64), F32),
        "all_gather_into_tensor: output_tensor has dtype torch.float64 but input_tensor has dtype "
        f"torch.float32; {MIXED}",
    ),
    (
        "reduce_scatter_tensor size",
        None,
        lambda pg, r: pg.reduce_scatter_single(F32.clone(), torch.ones(5), _rs()),
        "reduce_scatter_tensor: input has 5 elements, expected group size 2 * output numel 4 = 8",
    ),
    (
        "reduce_scatter_tensor dtype",
        None,
        lambda pg, r: pg.reduce_scatter_single(F32.clone(), torch.ones(8, dtype=torch.float64), _rs()),
        f"reduce_scatter_tensor: output has dtype torch.float32 but input has dtype torch.float64; {MIXED}",
    ),
    (
        "broadcast root outside the group",
        None,
        lambda pg, r: pg.broadcast([F32.clone()], _opts(dist.BroadcastOptions, rootRank=3)),
        "broadcast: root group rank 3 is outside the group of size 2",
    ),
    (
        "send to itself",
        None,
        lambda pg, r: pg.send([F32], r, 0),
        "send: dst is this rank itself ({rank})",
    ),
    (
        "recv from outside the group",
        None,
        lambda pg, r: pg.recv([F32.clone()], 5, 0),
        "recv: src group rank 5 is outside the group of size 2",
    ),
]


@pytest.mark.parametrize(
    ("who", "call", "message"), [c[1:] for c in VALUE_ERRORS], ids=[c[0] for c in VALUE_ERRORS]
)
def test_bad_arguments_are_named_in_the_error(
    who: int | None, call: Callable[[Any, int], Any], message: str
) -> None:
    def body(ctx: simdist.RankContext) -> str:
        if who is not None and ctx.rank != who:
            return "not called"
        try:
            call(dist.group.WORLD, ctx.rank)
        except ValueError as exc:
            return str(exc)
        return "no error"

    expected = message.format(rank="{rank}")
    results = simdist.run(body, world_size=2, timeout=60)
    for rank, got in enumerate(results):
        if who is not None and rank != who:
            assert got == "not called"
        else:
            assert got == expected.format(rank=rank)


def _max_options() -> dist.AllreduceOptions:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    return opts


# Calls simdist refuses: the error is noted world-wide, so the run fails even
# though the body catches it and goes on.
REFUSED: list[tuple[str, Callable[[Any], Any], str]] = [
    (
        "two tensors",
        lambda pg: pg.allreduce([F32.clone(), F32.clone()]),
        "all_reduce: simdist takes one tensor per rank per call, got 2",
    ),
    (
        "sparse all_reduce with MAX",
        lambda pg: pg.allreduce([torch.ones(2).to_sparse()], _max_options()),
        "allreduce of sparse tensors only works with ReduceOp.SUM",
    ),
    (
        "coalescing manager",
        lambda pg: pg._start_coalescing(torch.device("cpu")),
        "coalescing managers are not supported by simdist",
    ),
]


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_calls_fail_the_run_even_when_caught(call: Callable[[Any], Any], message: str) -> None:
    def body(ctx: simdist.RankContext) -> str:
        try:
            call(dist.group.WORLD)
        except simdist.UnsupportedOperationError as exc:
            return str(exc)
        return "no error"

    with pytest.raises(simdist.RankError, match=re.escape(message)):
        simdist.run(body, world_size=2, timeout=60)


def _gather_inputs(rank: int) -> list[torch.Tensor]:
    return [torch.arange(2.0) + 10 * rank, torch.arange(3.0) + 100 * rank]


def test_coalesced_all_gather_into_tensor_is_each_gather_in_turn() -> None:
    def body(ctx: simdist.RankContext) -> list[list[float]]:
        inputs = _gather_inputs(ctx.rank)
        outputs = [torch.empty(2 * len(t)) for t in inputs]
        work = dist.group.WORLD.allgather_into_tensor_coalesced(outputs, inputs)
        work.wait()
        assert work.is_completed() and work.is_success()
        return [o.tolist() for o in outputs]

    expected = [torch.cat([_gather_inputs(0)[i], _gather_inputs(1)[i]]).tolist() for i in range(2)]
    assert simdist.run(body, world_size=2, timeout=60) == [expected, expected]


def test_coalesced_reduce_scatter_tensor_sums_each_pair() -> None:
    def inputs_of(rank: int) -> list[torch.Tensor]:
        return [torch.arange(4.0) * (rank + 1), torch.arange(6.0) - rank]

    def body(ctx: simdist.RankContext) -> list[list[float]]:
        inputs = inputs_of(ctx.rank)
        outputs = [torch.empty(len(t) // 2) for t in inputs]
        dist.group.WORLD.reduce_scatter_tensor_coalesced(outputs, inputs, _rs()).wait()
        return [o.tolist() for o in outputs]

    # Independent reference in float64: the sum over ranks, rank r keeps chunk r.
    sums = [inputs_of(0)[i].double() + inputs_of(1)[i].double() for i in range(2)]
    expected = [[s.chunk(2)[rank].tolist() for s in sums] for rank in range(2)]
    assert simdist.run(body, world_size=2, timeout=60) == expected
