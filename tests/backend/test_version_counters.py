"""Autograd version counters after each op: simdist moves them exactly where gloo does.

gloo (torch 2.13) writes some outputs through tensor copies that autograd sees
(all_gather's list, all_gather_into_tensor once per member, reduce_scatter, gather's
list on the destination, all_to_all's list, all_reduce_coalesced, and AVG's
division after a sum) and the rest straight into memory. A tensor saved for backward and then overwritten by one
of the former makes backward raise on gloo; simdist must raise too, not
compute a gradient from overwritten values.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist

import simdist

TIMEOUT = 60.0


def _calls(rank: int, n: int) -> list[tuple[str, list[torch.Tensor], Callable[[], object]]]:
    """(name, the tensors whose counters are read, the call) per op."""

    def t(*shape: int) -> torch.Tensor:
        return torch.full(shape, float(rank + 1))

    x1, x2, x3 = t(4), t(4), t(4)
    g_in, g_outs = t(2), [torch.zeros(2) for _ in range(n)]
    gt_in, gt_out = t(2), torch.zeros(2 * n)
    rs_out, rs_ins = torch.zeros(2), [t(2) for _ in range(n)]
    rst_in, rst_out = t(2 * n), torch.zeros(2)
    ga_in, ga_outs = t(2), ([torch.zeros(2) for _ in range(n)] if rank == 0 else [])
    sc_out, sc_ins = torch.zeros(2), ([t(2) for _ in range(n)] if rank == 0 else [])
    a2a_outs, a2a_ins = [torch.zeros(2) for _ in range(n)], [t(2) for _ in range(n)]
    a2s_in, a2s_out = t(2 * n), torch.zeros(2 * n)
    co_a, co_b = t(2), t(3)
    p2p = t(3)
    peer = 1 - rank if rank < 2 else None
    calls = [
        ("all_reduce", [x1], lambda: dist.all_reduce(x1)),
        ("broadcast", [x2], lambda: dist.broadcast(x2, 0)),
        ("reduce", [x3], lambda: dist.reduce(x3, 0)),
        ("all_gather", [g_in, *g_outs], lambda: dist.all_gather(g_outs, g_in)),
        ("all_gather_into_tensor", [gt_in, gt_out], lambda: dist.all_gather_into_tensor(gt_out, gt_in)),
        ("reduce_scatter", [rs_out, *rs_ins], lambda: dist.reduce_scatter(rs_out, rs_ins)),
        ("reduce_scatter_tensor", [rst_in, rst_out], lambda: dist.reduce_scatter_tensor(rst_out, rst_in)),
        ("gather", [ga_in, *ga_outs], lambda: dist.gather(ga_in, ga_outs or None, dst=0)),
        ("scatter", [sc_out, *sc_ins], lambda: dist.scatter(sc_out, sc_ins or None, src=0)),
        ("all_to_all", [*a2a_outs, *a2a_ins], lambda: dist.all_to_all(a2a_outs, a2a_ins)),
        ("all_to_all_single", [a2s_in, a2s_out], lambda: dist.all_to_all_single(a2s_out, a2s_in)),
        ("all_reduce_coalesced", [co_a, co_b], lambda: dist.all_reduce_coalesced([co_a, co_b])),
    ]
    # AVG: gloo sums, then divides the result in place with a torch op autograd sees.
    avg = dist.ReduceOp.AVG
    y1, y2 = t(4), t(4)
    ars_out, ars_ins = torch.zeros(2), [t(2) for _ in range(n)]
    arst_in, arst_out = t(2 * n), torch.zeros(2)
    aco = t(2)
    calls += [
        ("all_reduce AVG", [y1], lambda: dist.all_reduce(y1, op=avg)),
        ("reduce AVG", [y2], lambda: dist.reduce(y2, 0, op=avg)),
        ("reduce_scatter AVG", [ars_out, *ars_ins], lambda: dist.reduce_scatter(ars_out, ars_ins, op=avg)),
        (
            "reduce_scatter_tensor AVG",
            [arst_in, arst_out],
            lambda: dist.reduce_scatter_tensor(arst_out, arst_in, op=avg),
        ),
        ("all_reduce_coalesced AVG", [aco], lambda: dist.all_reduce_coalesced([aco], op=avg)),
    ]
    if peer is not None:
        if rank == 0:
            calls.append(("send", [p2p], lambda: dist.send(p2p, peer)))
            calls.append(("isend", [p2p], lambda: dist.isend(p2p, peer).wait()))
        else:
            calls.append(("recv", [p2p], lambda: dist.recv(p2p, peer)))
            calls.append(("irecv", [p2p], lambda: dist.irecv(p2p, peer).wait()))
    return calls


def version_deltas(ctx: simdist.RankContext) -> dict[str, list[int]]:
    out = {}
    for name, tensors, call in _calls(ctx.rank, ctx.world_size):
        before = [x._version for x in tensors]
        call()
        out[name] = [x._version - b for x, b in zip(tensors, before)]
    return out


def saved_then_gathered(ctx: simdist.RankContext) -> str:
    """Backward through a tensor saved for backward and then overwritten by all_gather."""
    w = torch.ones(3, requires_grad=True)
    outs = [torch.zeros(3) for _ in range(ctx.world_size)]
    y = outs[0] * w  # saves outs[0] for w's gradient
    dist.all_gather(outs, torch.full((3,), float(ctx.rank + 2)))
    try:
        y.sum().backward()
    except RuntimeError as exc:
        return (
            "modified by an inplace operation" if "modified by an inplace operation" in str(exc) else str(exc)
        )
    return f"no error, grad {w.grad.tolist()}"


def saved_then_all_reduced(ctx: simdist.RankContext) -> list[float]:
    """all_reduce writes without moving the counter on gloo: backward still runs (on the new values)."""
    w = torch.ones(3, requires_grad=True)
    x = torch.full((3,), float(ctx.rank + 1))
    y = x * w
    dist.all_reduce(x)
    y.sum().backward()
    return w.grad.tolist()


@pytest.fixture(scope="module")
def gloo_table() -> list[dict[str, list[int]]]:
    return simdist.run_processes(version_deltas, world_size=3, backend="gloo", timeout=120)


@pytest.mark.gloo
def test_version_counters_move_as_on_gloo_op_by_op(gloo_table: list[dict[str, list[int]]]) -> None:
    sim = simdist.run(version_deltas, world_size=3, timeout=TIMEOUT)
    for rank in range(3):
        assert set(sim[rank]) == set(gloo_table[rank])
        for op in gloo_table[rank]:
            assert sim[rank][op] == gloo_table[rank][op], f"rank {rank} {op}"
    # The moves docs/never-hang.md states, so a change on either side is seen here.
    assert gloo_table[0]["all_gather"] == [0, 1, 1, 1]
    assert gloo_table[0]["all_gather_into_tensor"] == [0, 3]  # one per member
    assert gloo_table[0]["all_reduce"] == [0] and gloo_table[1]["recv"] == [0]
    assert gloo_table[1]["all_reduce AVG"] == [1] and gloo_table[1]["reduce AVG"] == [1]


@pytest.mark.gloo
def test_backward_through_a_tensor_an_all_gather_overwrote_raises_on_both() -> None:
    gloo = simdist.run_processes(saved_then_gathered, world_size=2, backend="gloo", timeout=120)
    sim = simdist.run(saved_then_gathered, world_size=2, timeout=TIMEOUT)
    assert gloo == sim == ["modified by an inplace operation"] * 2


@pytest.mark.gloo
def test_backward_through_an_all_reduced_tensor_runs_on_both() -> None:
    gloo = simdist.run_processes(saved_then_all_reduced, world_size=2, backend="gloo", timeout=120)
    sim = simdist.run(saved_then_all_reduced, world_size=2, timeout=TIMEOUT)
    assert gloo == sim == [[3.0, 3.0, 3.0]] * 2
