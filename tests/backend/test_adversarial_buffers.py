"""Buffers and dtypes as strict as a real backend.

In-place forms of the gathers and scatters give the numpy reference's result
(and gloo's, in the ``gloo`` test); writing a result does not move autograd's
version counter; outputs and inputs of different dtypes are refused; and two
ranks' buffers sharing memory (impossible on a cluster) are an error naming
both ranks, the op and the call sites, while strided views that interleave
without sharing stay legal.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import collective_reference as ref
import numpy as np
import pytest
import torch
import torch.distributed as dist

import simdist

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning"),
    pytest.mark.usefixtures("clean_world"),
]

TIMEOUT = 30.0
K = 3


def data(rank: int) -> torch.Tensor:
    return torch.arange(K, dtype=torch.float32) + 10.0 * (rank + 1)


# --- in-place forms -----------------------------------------------------------------------


def in_place_body(ctx: simdist.RankContext) -> dict[str, Any]:
    """Every in-place form, as FSDP2 and friends write them; returns plain lists."""
    r, n = ctx.rank, ctx.world_size
    out: dict[str, Any] = {}
    # all_gather_into_tensor: the input is this rank's slot of the output.
    flat = torch.zeros(n * K)
    flat.narrow(0, r * K, K).copy_(data(r))
    dist.all_gather_into_tensor(flat, flat.narrow(0, r * K, K))
    out["all_gather_into_tensor"] = flat.tolist()
    # reduce_scatter_tensor: the output is this rank's slot of the input.
    full = torch.cat([data(r) + j for j in range(n)])
    dist.reduce_scatter_tensor(full.narrow(0, r * K, K), full)
    out["reduce_scatter_tensor"] = full.narrow(0, r * K, K).tolist()
    # all_gather (list): the input is this rank's own entry of the list.
    slots = [torch.zeros(K) for _ in range(n)]
    slots[r].copy_(data(r))
    dist.all_gather(slots, slots[r])
    out["all_gather"] = [s.tolist() for s in slots]
    # gather: the root's input is its own entry of gather_list.
    root = n - 1
    if r == root:
        gathered = [torch.zeros(K) for _ in range(n)]
        gathered[r].copy_(data(r))
        dist.gather(gathered[r], gathered, dst=root)
        out["gather"] = [g.tolist() for g in gathered]
    else:
        dist.gather(data(r), None, dst=root)
    # scatter: the root's output is its own entry of scatter_list.
    if r == 0:
        chunks = [data(j) * 2 for j in range(n)]
        dist.scatter(chunks[0], chunks, src=0)
        out["scatter"] = chunks[0].tolist()
    else:
        received = torch.zeros(K)
        dist.scatter(received, None, src=0)
        out["scatter"] = received.tolist()
    return out


def expected_in_place(n: int) -> list[dict[str, Any]]:
    inputs = [data(r).numpy().astype(np.float64) for r in range(n)]
    fulls = [np.concatenate([inputs[r] + j for j in range(n)]) for r in range(n)]
    gathered = ref.all_gather_into_tensor(inputs)
    scattered = ref.reduce_scatter_tensor(fulls, "SUM")
    lists = ref.all_gather(inputs)
    sent = ref.scatter([a * 2 for a in inputs], n)
    want = []
    for r in range(n):
        row: dict[str, Any] = {
            "all_gather_into_tensor": gathered[r].tolist(),
            "reduce_scatter_tensor": scattered[r].tolist(),
            "all_gather": [a.tolist() for a in lists[r]],
            "scatter": sent[r].tolist(),
        }
        if r == n - 1:
            row["gather"] = [a.tolist() for a in ref.gather(inputs, n - 1)]
        want.append(row)
    return want


@pytest.mark.parametrize("n", [2, 3])
def test_in_place_collectives_match_the_reference(n: int) -> None:
    assert simdist.run(in_place_body, world_size=n, timeout=TIMEOUT) == expected_in_place(n)


@pytest.mark.gloo
def test_in_place_collectives_match_gloo() -> None:
    gloo = simdist.run_processes(in_place_body, world_size=2, timeout=120)
    assert simdist.run(in_place_body, world_size=2, timeout=TIMEOUT) == gloo


# --- the version counter -----------------------------------------------------------------


def saved_then_reduced_body(ctx: simdist.RankContext) -> list[float]:
    w = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = w * (ctx.rank + 1)
    z = (y * y).sum()  # saves y for backward
    dist.all_reduce(y)  # y becomes 3w on both ranks
    z.backward()  # as on gloo: the saved y is read as it is now
    assert w.grad is not None
    return w.grad.tolist()


def test_a_result_written_into_a_saved_tensor_does_not_break_backward() -> None:
    # dz/dw = 2 * y * (r + 1), with y = 3w after the all_reduce.
    assert simdist.run(saved_then_reduced_body, world_size=2, timeout=TIMEOUT) == [
        [6.0, 12.0, 18.0],
        [12.0, 24.0, 36.0],
    ]


# --- dtypes -----------------------------------------------------------------------------


def mixed_dtype_call(op: str, n: int) -> None:
    f32, f64 = torch.float32, torch.float64
    if op == "all_gather_into_tensor":
        dist.all_gather_into_tensor(torch.zeros(n * K, dtype=f64), torch.ones(K, dtype=f32))
    elif op == "reduce_scatter_tensor":
        dist.reduce_scatter_tensor(torch.zeros(K, dtype=f32), torch.ones(n * K, dtype=f64))
    elif op == "all_gather":
        dist.all_gather([torch.zeros(K, dtype=f64) for _ in range(n)], torch.ones(K, dtype=f32))
    elif op == "reduce_scatter":
        dist.reduce_scatter(torch.zeros(K, dtype=f32), [torch.ones(K, dtype=f64) for _ in range(n)])
    elif op == "gather":
        dist.gather(
            torch.ones(K, dtype=f32), [torch.zeros(K, dtype=f64) for _ in range(n)], dst=dist.get_rank()
        )
    elif op == "scatter":
        dist.scatter(
            torch.zeros(K, dtype=f32), [torch.ones(K, dtype=f64) for _ in range(n)], src=dist.get_rank()
        )
    elif op == "all_to_all_single":
        dist.all_to_all_single(torch.zeros(n * K, dtype=f64), torch.ones(n * K, dtype=f32))
    elif op == "all_to_all":
        dist.all_to_all(
            [torch.zeros(K, dtype=f64) for _ in range(n)], [torch.ones(K, dtype=f32) for _ in range(n)]
        )
    else:
        raise AssertionError(op)


def mixed_dtype_body(ctx: simdist.RankContext, op: str) -> None:
    mixed_dtype_call(op, ctx.world_size)


@pytest.mark.parametrize(
    "op",
    [
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_gather",
        "reduce_scatter",
        "gather",
        "scatter",
        "all_to_all",
        "all_to_all_single",
    ],
)
def test_outputs_and_inputs_of_different_dtypes_are_refused(op: str) -> None:
    # gather and scatter run on one rank (its own root), so the error is its alone.
    # torch.distributed refuses the list forms itself; simdist the tensor forms.
    n = 1 if op in ("gather", "scatter") else 2
    with pytest.raises(simdist.RankError) as info:
        simdist.run(mixed_dtype_body, world_size=n, timeout=TIMEOUT, args=(op,))
    assert sorted(info.value.failures) == list(range(n))
    for exc in info.value.failures.values():
        assert isinstance(exc, ValueError)
        assert "torch.float32" in str(exc) and "torch.float64" in str(exc)
        if op.endswith("_tensor"):
            assert exc.args[0].startswith(f"{op}: ") and "refuse mixed dtypes" in str(exc)


# --- memory shared between members ------------------------------------------------------


def shared_output_body(ctx: simdist.RankContext, shared: torch.Tensor) -> None:
    dist.all_reduce(shared)  # shared output


def shared_input_body(ctx: simdist.RankContext, scratch: torch.Tensor) -> None:
    # Rank 0 gathers into the scratch buffer; rank 1 reads its input from it.
    if ctx.rank == 0:
        dist.all_gather_into_tensor(scratch, torch.ones(2))  # rank 0 output
    else:
        dist.all_gather_into_tensor(torch.zeros(4), scratch.narrow(0, 2, 2))  # rank 1 input


def overlap_error(body: Callable[..., Any], arg: torch.Tensor) -> str:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, world_size=2, timeout=TIMEOUT, args=(arg,), share_args=True)
    err = info.value
    assert isinstance(err.__cause__, simdist.BufferOverlapError)
    assert sorted(err.failures) == [0, 1], "every member learns of it"
    return str(err.__cause__)


def test_two_ranks_writing_the_same_tensor_is_refused() -> None:
    message = overlap_error(shared_output_body, torch.ones(4))
    assert message.startswith("all_reduce on world [0, 1] seq 0: rank 0's output 't'")
    assert "rank 1's output 't'" in message and "share memory" in message
    assert len(re.findall(r"test_adversarial_buffers\.py:\d+", message)) == 2


def test_an_output_overlapping_another_members_input_is_refused() -> None:
    message = overlap_error(shared_input_body, torch.zeros(4))
    assert "all_gather_into_tensor on world [0, 1] seq 0" in message
    assert "rank 0's output 'out_flat'" in message and "rank 1's input 'in'" in message


def columns_body(ctx: simdist.RankContext, matrix: torch.Tensor) -> list[list[float]]:
    # Each rank gathers into two columns of one shared matrix: interleaved with
    # the other rank's columns in memory, never the same element.
    outs = [matrix[:, 2 * ctx.rank], matrix[:, 2 * ctx.rank + 1]]
    dist.all_gather(outs, torch.full((3,), float(ctx.rank + 1)))
    return [o.tolist() for o in outs]


def test_interleaved_views_that_share_no_element_are_legal() -> None:
    matrix = torch.zeros(3, 4)
    want = [[1.0] * 3, [2.0] * 3]
    got = simdist.run(columns_body, world_size=2, timeout=TIMEOUT, args=(matrix,), share_args=True)
    assert got == [want, want]
    assert matrix.tolist() == [[1.0, 2.0, 1.0, 2.0]] * 3


def column_body(ctx: simdist.RankContext, matrix: torch.Tensor) -> list[float]:
    column = matrix[:, ctx.rank]
    dist.all_reduce(column)
    return column.tolist()


def test_a_strided_view_is_refused_where_gloo_would_write_outside_it() -> None:
    # gloo's all_reduce reads and writes a strided view's memory as if it were
    # contiguous (measured: wrong values, elements outside the view changed);
    # NCCL refuses it. simdist refuses it on every member, naming the strides.
    matrix = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    with pytest.raises(simdist.RankError) as info:
        simdist.run(column_body, world_size=2, timeout=TIMEOUT, args=(matrix,))
    assert sorted(info.value.failures) == [0, 1]
    assert "all_reduce: tensor must be contiguous, got shape [3] with strides (2,)" in str(info.value)
