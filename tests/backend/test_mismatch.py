"""Collective verification: members that meet at one sequence number with
different calls all fail with ``CollectiveMismatchError`` and a table naming
rank, coordinates, op, shapes/dtypes/reduce op/root and call site.

Bodies catch the error per rank where the test needs to see that *every* member
failed (and that the group stays usable afterwards); other tests let it escape
and check what ``simdist.run`` raises.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import Layout

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")

TIMEOUT = 60.0
THIS_FILE = "test_mismatch.py"
FULL = Layout(tp=2, cp=2, dp=2, pp=2)


def line_of(fn: Callable[..., Any], needle: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def coords_text(layout: Layout, rank: int) -> str:
    c = layout.coords(rank)
    return f"tp={c.tp} cp={c.cp} dp={c.dp} pp={c.pp}"


# --- one rank deviates; every member of its group must fail ---------------------------


def deviant_call(kind: str, group: dist.ProcessGroup) -> None:
    if kind == "shape":
        dist.all_reduce(torch.ones(5), group=group)  # deviant shape
    elif kind == "same_numel_other_shape":
        dist.all_reduce(torch.ones(2, 2), group=group)  # deviant same_numel_other_shape
    elif kind == "dtype":
        dist.all_reduce(torch.ones(4, dtype=torch.float64), group=group)  # deviant dtype
    elif kind == "op":
        dist.broadcast(torch.ones(4), group=group, group_src=0)  # deviant op
    elif kind == "reduce_op":
        dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX, group=group)  # deviant reduce_op
    elif kind == "barrier":
        dist.barrier(group=group)  # deviant barrier
    else:
        raise AssertionError(kind)


def one_deviant_body(ctx: simdist.RankContext, kind: str, axis: str, culprit: int) -> dict[str, Any]:
    group = ctx.groups[axis]
    out: dict[str, Any] = {"status": "ok", "message": None}
    try:
        if ctx.rank == culprit:
            deviant_call(kind, group)
        else:
            dist.all_reduce(torch.ones(4), group=group)  # normal call
    except simdist.CollectiveMismatchError as exc:
        out = {"status": "mismatch", "message": str(exc)}
    # Both members advanced their sequence numbers: the group still works.
    follow_up = torch.ones(1)
    dist.all_reduce(follow_up, group=group)
    out["follow_up"] = follow_up.item()
    return out


EXPECTED_DEVIANT = {
    "shape": ("all_reduce", "shape=(5,)"),
    "same_numel_other_shape": ("all_reduce", "shape=(2, 2)"),
    "dtype": ("all_reduce", "dtype=torch.float64"),
    "op": ("broadcast", "root=0"),
    "reduce_op": ("all_reduce", "reduce_op=MAX"),
    "barrier": ("barrier", ""),
}


def check_deviant_run(layout: Layout, kind: str, axis: str, culprit: int) -> None:
    # Every member caught the mismatch and went on: run() raises it all the
    # same, and still shows what each rank returned.
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(one_deviant_body, layout=layout, timeout=TIMEOUT, args=(kind, axis, culprit))
    results = info.value.results
    members = layout.group_of(axis, culprit)
    for rank, out in enumerate(results):
        assert out["follow_up"] == len(layout.group_of(axis, rank))
        if rank not in members:
            assert out["status"] == "ok", (rank, out)
            continue
        assert out["status"] == "mismatch", (rank, out)
    messages = {results[r]["message"] for r in members}
    assert len(messages) == 1, "every member must get the same report"
    message = messages.pop()
    assert str(info.value).startswith(message)
    assert "at sequence number 0" in message
    assert f"{list(members)}" in message
    deviant_op, deviant_detail = EXPECTED_DEVIANT[kind]
    normal_line = line_of(one_deviant_body, "# normal call")
    deviant_line = line_of(deviant_call, f"# deviant {kind}")
    rows = [line for line in message.splitlines() if line.strip().startswith("rank ")]
    assert len(rows) == len(members), message
    for rank, row in zip(members, rows):
        assert row.split()[:2] == ["rank", str(rank)], row
        assert coords_text(layout, rank) in row
        if rank == culprit:
            assert deviant_op in row and deviant_detail in row
            assert f"{THIS_FILE}:{deviant_line}" in row
        else:
            assert "all_reduce" in row and "shape=(4,)" in row and "dtype=torch.float32" in row
            assert "reduce_op=SUM" in row
            assert f"{THIS_FILE}:{normal_line}" in row


@pytest.mark.parametrize("kind", sorted(EXPECTED_DEVIANT))
def test_every_member_fails_with_a_table(kind: str) -> None:
    layout = Layout(tp=2, dp=2)
    check_deviant_run(layout, kind, "dp", culprit=layout.rank_of(tp=1, cp=0, dp=1, pp=0))


@pytest.mark.parametrize("axis", ["tp", "cp", "dp", "pp"])
def test_mismatch_on_each_axis_reports_only_that_group(axis: str) -> None:
    check_deviant_run(FULL, "shape", axis, culprit=FULL.rank_of(tp=1, cp=0, dp=1, pp=1))


# --- what simdist.run raises --------------------------------------------------------


def later_mismatch_body(ctx: simdist.RankContext) -> None:
    for _ in range(2):
        dist.all_reduce(torch.ones(3), group=ctx.groups.pp)
    dist.all_reduce(torch.ones(3 + ctx.coords.pp), group=ctx.groups.pp)


def test_run_raises_the_mismatch_with_its_sequence_number() -> None:
    layout = Layout(pp=2)
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(later_mismatch_body, layout=layout, timeout=TIMEOUT)
    assert type(info.value) is simdist.CollectiveMismatchError
    message = str(info.value)
    assert "collective mismatch on pp" in message and "at sequence number 2" in message
    assert "shape=(3,)" in message and "shape=(4,)" in message
    # The flight recorder shows the two calls that matched before it.
    assert "seq 1 shapes [[3]] float32 12 B" in message and ": completed" in message


def swapped_order_body(ctx: simdist.RankContext) -> None:
    loss, grads = torch.ones(1), torch.ones(8)
    if ctx.rank == 0:
        dist.all_reduce(loss)
        dist.all_reduce(grads)
    else:
        dist.all_reduce(grads)
        dist.all_reduce(loss)


def test_same_group_in_different_order_is_a_mismatch_not_a_hang() -> None:
    with pytest.raises(simdist.CollectiveMismatchError, match=r"shape=\(1,\)[\s\S]*shape=\(8,\)"):
        simdist.run(swapped_order_body, world_size=2, timeout=TIMEOUT)


def root_body(ctx: simdist.RankContext) -> None:
    dist.broadcast(torch.ones(2), src=ctx.rank % 2)


def test_broadcast_root_mismatch() -> None:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(root_body, world_size=2, timeout=TIMEOUT)
    assert "root=0" in str(info.value) and "root=1" in str(info.value)


def gather_into_tensor_body(ctx: simdist.RankContext) -> None:
    n = 2 + ctx.rank
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.ones(n))


def reduce_scatter_tensor_body(ctx: simdist.RankContext) -> None:
    n = 2 + ctx.rank
    dist.reduce_scatter_tensor(torch.empty(n), torch.ones(2 * n))


@pytest.mark.parametrize(
    "body, op",
    [
        (gather_into_tensor_body, "all_gather_into_tensor"),
        (reduce_scatter_tensor_body, "reduce_scatter_tensor"),
    ],
)
def test_tensor_collectives_with_different_shapes(body: Callable[..., None], op: str) -> None:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(body, world_size=2, timeout=TIMEOUT)
    message = str(info.value)
    assert op in message and "shape=(2,)" in message and "shape=(3,)" in message


def all_to_all_split_body(ctx: simdist.RankContext) -> None:
    # Rank 0 sends 1 row to rank 1, but rank 1 expects 2 rows from it.
    if ctx.rank == 0:
        dist.all_to_all_single(torch.empty(3), torch.ones(3), [2, 1], [2, 1])
    else:
        dist.all_to_all_single(torch.empty(4), torch.ones(4), [2, 2], [2, 2])


def test_all_to_all_split_disagreement() -> None:
    with pytest.raises(
        simdist.CollectiveMismatchError, match="rank 0 sends 1 rows to rank 1, which expects 2"
    ):
        simdist.run(all_to_all_split_body, world_size=2, timeout=TIMEOUT)


def p2p_dtype_body(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        dist.send(torch.ones(3), dst=1)
    else:
        dist.recv(torch.zeros(3, dtype=torch.float64), src=0)


def test_send_recv_dtype_mismatch_fails_both_ends() -> None:
    with pytest.raises(simdist.CollectiveMismatchError) as info:
        simdist.run(p2p_dtype_body, world_size=2, timeout=TIMEOUT)
    message = str(info.value)
    assert "send/recv mismatch between rank 0 and rank 1" in message
    assert "torch.float32" in message and "torch.float64" in message
    assert f"{THIS_FILE}:{line_of(p2p_dtype_body, 'dist.send')}" in message
    assert f"{THIS_FILE}:{line_of(p2p_dtype_body, 'dist.recv')}" in message


def matching_body(ctx: simdist.RankContext) -> float:
    # Same op, shape, dtype, reduce op and root, from different source lines:
    # call sites are reported, never compared.
    t = torch.ones(2)
    if ctx.rank == 0:
        dist.all_reduce(t)
    else:
        dist.all_reduce(t)
    return t.sum().item()


def test_different_call_sites_are_not_a_mismatch() -> None:
    assert simdist.run(matching_body, world_size=2, timeout=TIMEOUT) == [4.0, 4.0]
