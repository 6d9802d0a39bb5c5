"""SPMD programs run unchanged on simdist and on a real gloo world.

Every program is a module-level function ``program(ctx, seed) -> result`` that
only speaks public ``torch.distributed``. Inputs are derived from the rank, the
program and the seed, so the two worlds see identical data; results are nested
dicts/lists of tensors and plain Python values that the differential test
compares leaf by leaf.

All programs are valid on NCCL too: every rank issues the same collectives on a
group in the same order, and point-to-point traffic is either batched
(``batch_isend_irecv``) or ordered so that a blocking send always has its
receiver already waiting or about to wait.

``run_programs`` runs a list of programs in one world launch, because starting
a real world costs far more than running a program in it.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from simdist.context import RankContext

Program = Callable[[RankContext, int], Any]
PROGRAMS: dict[str, Program] = {}

INT_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
# AVG is a float-only op on gloo (it divides in place).
FLOAT_OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")


def program(fn: Program) -> Program:
    PROGRAMS[fn.__name__] = fn
    return fn


def run_programs(ctx: RankContext, names: list[str], seed: int) -> dict[str, Any]:
    """Run the named programs in order on this rank; results by program name."""
    # The *_tensor spellings are deprecated in favour of *_single on torch 2.13
    # but remain public API that simdist must serve; keep logs readable. A
    # plain filter (not catch_warnings) because ranks may be threads.
    warnings.filterwarnings(
        "ignore", message=r".*is deprecated. Please use `torch.distributed", category=FutureWarning
    )
    return {name: PROGRAMS[name](ctx, seed) for name in names}


# --------------------------------------------------------------------------- #
# Inputs and groups
# --------------------------------------------------------------------------- #


def make_generator(seed: int, rank: int, tag: str) -> torch.Generator:
    """A generator for one (seed, rank, purpose): both worlds draw the same data."""
    mixed = (seed * 1_000_003 + rank * 7_919 + zlib.crc32(tag.encode())) % (2**63)
    return torch.Generator().manual_seed(mixed)


def int_input(
    seed: int,
    rank: int,
    tag: str,
    shape: tuple[int, ...],
    low: int,
    high: int,
    dtype: torch.dtype = torch.int64,
) -> torch.Tensor:
    return torch.randint(low, high, shape, generator=make_generator(seed, rank, tag), dtype=dtype)


def float_input(
    seed: int, rank: int, tag: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.randn(shape, generator=make_generator(seed, rank, tag), dtype=torch.float64).to(dtype)


def axis_groups(ctx: RankContext) -> list[tuple[str, dist.ProcessGroup]]:
    """The groups a program exercises: each layout axis with more than one rank, and world.

    The default group is passed as ``None`` so that path is exercised too.
    """
    chosen: list[tuple[str, dist.ProcessGroup]] = []
    seen: list[list[int]] = []
    if ctx.layout is not None:
        for axis in ("tp", "cp", "dp", "pp", "dp_cp", "mp"):
            ranks = ctx.layout.group_of(axis, ctx.rank)
            # dp_cp equals dp when cp == 1 (and so on): one pass per distinct group.
            if len(ranks) > 1 and ranks not in seen:
                seen.append(ranks)
                chosen.append((axis, ctx.groups[axis]))
    chosen.append(("world", None))  # type: ignore[arg-type]
    return chosen


def members(group: dist.ProcessGroup | None) -> list[int]:
    """Global ranks of ``group`` in group-rank order."""
    return dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)  # type: ignore[arg-type]


def group_rank(group: dist.ProcessGroup | None) -> int:
    return dist.get_rank(group) if group is not None else dist.get_rank()


def _to(ctx: RankContext, t: torch.Tensor) -> torch.Tensor:
    return t.to(ctx.device)


# --------------------------------------------------------------------------- #
# Reductions
# --------------------------------------------------------------------------- #


@program
def all_reduce_int(ctx: RankContext, seed: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for axis, group in axis_groups(ctx):
        for op in INT_OPS:
            # Small magnitudes keep PRODUCT far from int64 overflow; bitwise
            # ops get non-negative bit patterns.
            low, high = (-3, 4) if op != "PRODUCT" else (-2, 3)
            if op in ("BAND", "BOR", "BXOR"):
                low, high = 0, 256
            t = _to(ctx, int_input(seed, ctx.rank, f"ar-{axis}-{op}", (5,), low, high))
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
            out[f"{axis}/{op}"] = t
        # Narrow integer types wrap identically on every backend.
        u8 = _to(ctx, int_input(seed, ctx.rank, f"ar-{axis}-u8", (6,), 0, 256, torch.uint8))
        dist.all_reduce(u8, op=dist.ReduceOp.BOR, group=group)
        out[f"{axis}/uint8-BOR"] = u8
        i32 = _to(ctx, int_input(seed, ctx.rank, f"ar-{axis}-i32", (2, 3), -1000, 1000, torch.int32))
        dist.all_reduce(i32, group=group)
        out[f"{axis}/int32-SUM"] = i32
    return out


@program
def all_reduce_float(ctx: RankContext, seed: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for axis, group in axis_groups(ctx):
        for op in FLOAT_OPS:
            for dtype in (torch.float32, torch.float64):
                t = _to(ctx, float_input(seed, ctx.rank, f"arf-{axis}-{op}-{dtype}", (7,), dtype))
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
                out[f"{axis}/{op}/{dtype}"] = t
        # Half precisions round at every addition, so a different summation
        # order may move random data by more than any fixed tolerance (under
        # cancellation). Quarters of small integers add exactly in any order:
        # these check dtype handling bit for bit.
        for dtype in (torch.bfloat16, torch.float16):
            quarters = int_input(seed, ctx.rank, f"arf-{axis}-{dtype}", (6,), -32, 33)
            half = _to(ctx, (quarters.to(torch.float64) / 4).to(dtype))
            dist.all_reduce(half, group=group)
            out[f"{axis}/SUM/{dtype}"] = half
    return out


@program
def reduce_to_root(ctx: RankContext, seed: int) -> dict[str, torch.Tensor | None]:
    out: dict[str, torch.Tensor | None] = {}
    for axis, group in axis_groups(ctx):
        ranks = members(group)
        for k, op in enumerate(("SUM", "MAX")):
            dst = ranks[k % len(ranks)]
            t = _to(ctx, int_input(seed, ctx.rank, f"red-{axis}-{op}", (4,), -50, 50))
            dist.reduce(t, dst=dst, op=getattr(dist.ReduceOp, op), group=group)
            # Non-root buffers are scratch space on some backends: only the
            # root's result is defined.
            out[f"{axis}/{op}"] = t if ctx.rank == dst else None
        f = _to(ctx, float_input(seed, ctx.rank, f"redf-{axis}", (3,)))
        root = ranks[-1]
        dist.reduce(f, dst=root, group=group)
        out[f"{axis}/float"] = f if ctx.rank == root else None
    return out


@program
def reduce_scatter_both(ctx: RankContext, seed: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for axis, group in axis_groups(ctx):
        n = len(members(group))
        full = _to(ctx, int_input(seed, ctx.rank, f"rs-{axis}", (n * 3,), -20, 20))
        single = torch.empty(3, dtype=full.dtype, device=ctx.device)
        dist.reduce_scatter_tensor(single, full, group=group)
        out[f"{axis}/tensor-SUM"] = single
        pieces = [p.clone() for p in full.chunk(n)]
        listed = torch.empty(3, dtype=full.dtype, device=ctx.device)
        dist.reduce_scatter(listed, pieces, op=dist.ReduceOp.MAX, group=group)
        out[f"{axis}/list-MAX"] = listed
        ffull = _to(ctx, float_input(seed, ctx.rank, f"rsf-{axis}", (n * 2, 2)))
        fout = torch.empty(2, 2, device=ctx.device)
        dist.reduce_scatter_tensor(fout, ffull, group=group)
        out[f"{axis}/tensor-float"] = fout
    return out


# --------------------------------------------------------------------------- #
# Data movement
# --------------------------------------------------------------------------- #


@program
def broadcast_roots(ctx: RankContext, seed: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for axis, group in axis_groups(ctx):
        ranks = members(group)
        for k in range(min(2, len(ranks))):
            src = ranks[(k * 2 + 1) % len(ranks)]
            t = _to(ctx, int_input(seed, ctx.rank, f"bc-{axis}-{k}", (2, 2), -9, 10))
            dist.broadcast(t, src=src, group=group)
            out[f"{axis}/src{k}"] = t
        f = _to(ctx, float_input(seed, ctx.rank, f"bcf-{axis}", (3,), torch.float64))
        # Group-local root: the second spelling of the same call.
        if group is not None:
            dist.broadcast(f, group=group, group_src=len(ranks) - 1)
        else:
            dist.broadcast(f, src=ranks[-1])
        out[f"{axis}/float"] = f
    return out


@program
def all_gather_both(ctx: RankContext, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for axis, group in axis_groups(ctx):
        n = len(members(group))
        mine = _to(ctx, int_input(seed, ctx.rank, f"ag-{axis}", (3,), -100, 100))
        gathered = [torch.empty_like(mine) for _ in range(n)]
        dist.all_gather(gathered, mine, group=group)
        out[f"{axis}/list"] = gathered
        flat = torch.empty(n * 3, dtype=mine.dtype, device=ctx.device)
        dist.all_gather_into_tensor(flat, mine, group=group)
        out[f"{axis}/tensor"] = flat
        fmine = _to(ctx, float_input(seed, ctx.rank, f"agf-{axis}", (2, 2), torch.float16))
        fflat = torch.empty(n * 2, 2, dtype=torch.float16, device=ctx.device)
        dist.all_gather_into_tensor(fflat, fmine, group=group)
        out[f"{axis}/tensor-f16"] = fflat
    return out


def _split(sender: int, receiver: int) -> int:
    """Uneven all_to_all split sizes: rows ``sender`` sends to ``receiver`` (0..3)."""
    return (2 * sender + receiver) % 4


@program
def all_to_all_both(ctx: RankContext, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for axis, group in axis_groups(ctx):
        n = len(members(group))
        me = group_rank(group)
        even_in = _to(ctx, int_input(seed, ctx.rank, f"a2a-{axis}", (n * 2, 3), -50, 50))
        even_out = torch.empty_like(even_in)
        dist.all_to_all_single(even_out, even_in, group=group)
        out[f"{axis}/single-even"] = even_out

        in_splits = [_split(me, j) for j in range(n)]
        out_splits = [_split(j, me) for j in range(n)]
        uneven_in = _to(ctx, float_input(seed, ctx.rank, f"a2au-{axis}", (sum(in_splits), 2)))
        uneven_out = torch.empty(sum(out_splits), 2, device=ctx.device)
        dist.all_to_all_single(
            uneven_out, uneven_in, output_split_sizes=out_splits, input_split_sizes=in_splits, group=group
        )
        out[f"{axis}/single-uneven"] = uneven_out

        # Gloo's list form wants equal sizes; unevenness is covered above.
        inputs = [_to(ctx, int_input(seed, ctx.rank, f"a2al-{axis}-{j}", (3,), 0, 1000)) for j in range(n)]
        outputs = [torch.empty(3, dtype=torch.int64, device=ctx.device) for _ in range(n)]
        dist.all_to_all(outputs, inputs, group=group)
        out[f"{axis}/list"] = outputs
    return out


@program
def gather_scatter(ctx: RankContext, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for axis, group in axis_groups(ctx):
        ranks = members(group)
        n = len(ranks)
        root = ranks[1 % n]
        mine = _to(ctx, int_input(seed, ctx.rank, f"ga-{axis}", (2,), -10, 10))
        gather_list = [torch.empty_like(mine) for _ in range(n)] if ctx.rank == root else None
        dist.gather(mine, gather_list, dst=root, group=group)
        out[f"{axis}/gather"] = gather_list

        src = ranks[-1]
        scatter_list = (
            [_to(ctx, float_input(seed, ctx.rank, f"sc-{axis}-{j}", (3,))) for j in range(n)]
            if ctx.rank == src
            else None
        )
        piece = torch.empty(3, device=ctx.device)
        dist.scatter(piece, scatter_list, src=src, group=group)
        out[f"{axis}/scatter"] = piece
    return out


@program
def object_collectives(ctx: RankContext, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mine = {
        "rank": ctx.rank,
        "coords": tuple(ctx.coords) if ctx.coords else None,
        "tag": f"s{seed}-r{ctx.rank}",
        "xs": list(range(ctx.rank + 1)),
    }
    for axis, group in axis_groups(ctx):
        ranks = members(group)
        n = len(ranks)
        gathered: list[Any] = [None] * n
        dist.all_gather_object(gathered, mine, group=group)
        out[f"{axis}/all_gather"] = gathered

        src = ranks[-1]
        box: list[Any] = [("from", ctx.rank, seed), {"k": [1.5, ctx.rank]}]
        dist.broadcast_object_list(box, src=src, group=group)
        out[f"{axis}/broadcast"] = box

        dst = ranks[0]
        glist: list[Any] | None = [None] * n if ctx.rank == dst else None
        dist.gather_object(mine, glist, dst=dst, group=group)
        out[f"{axis}/gather"] = glist

        root = ranks[n // 2]
        received: list[Any] = [None]
        offered = [f"for-{j}-from-{ctx.rank}" for j in range(n)] if ctx.rank == root else None
        dist.scatter_object_list(received, offered, src=root, group=group)
        out[f"{axis}/scatter"] = received
    return out


# --------------------------------------------------------------------------- #
# Point to point along pipeline stages
# --------------------------------------------------------------------------- #


def _stage_peers(ctx: RankContext) -> tuple[int, int, list[int]]:
    """(stage, number of stages, global ranks of the stages in order).

    Pipeline stages are the pp group in a layout, the whole world otherwise.
    """
    if ctx.layout is not None and ctx.layout.pp > 1:
        ranks = ctx.layout.group_of("pp", ctx.rank)
    else:
        ranks = list(range(ctx.world_size))
    return ranks.index(ctx.rank), len(ranks), ranks


@program
def pipeline_send_recv(ctx: RankContext, seed: int) -> dict[str, Any]:
    """Blocking send/recv: an activation flows forward, a gradient flows back."""
    stage, stages, ranks = _stage_peers(ctx)
    if stages == 1:
        return {}
    act = torch.empty(4, 2, device=ctx.device)
    if stage == 0:
        act = _to(ctx, float_input(seed, ctx.rank, "pp-act", (4, 2)))
    else:
        dist.recv(act, src=ranks[stage - 1])
    act = act * (stage + 2) + _to(ctx, float_input(seed, ctx.rank, "pp-bias", (4, 2)))
    if stage < stages - 1:
        dist.send(act, dst=ranks[stage + 1])

    grad = torch.empty(3, dtype=torch.int64, device=ctx.device)
    if stage == stages - 1:
        grad = _to(ctx, int_input(seed, ctx.rank, "pp-grad", (3,), -5, 5))
    else:
        dist.recv(grad, src=ranks[stage + 1])
    grad = grad * 3 + stage
    if stage > 0:
        dist.send(grad, dst=ranks[stage - 1])
    return {"act": act, "grad": grad}


@program
def ring_exchange(ctx: RankContext, seed: int) -> dict[str, Any]:
    """Each stage passes to the next around a ring, three ways: batched, async, even/odd ordered."""
    stage, stages, ranks = _stage_peers(ctx)
    if stages == 1:
        return {}
    nxt, prv = ranks[(stage + 1) % stages], ranks[(stage - 1) % stages]
    out: dict[str, Any] = {}

    send_buf = _to(ctx, int_input(seed, ctx.rank, "ring-batch", (5,), -100, 100))
    recv_buf = torch.empty_like(send_buf)
    ops = [dist.P2POp(dist.isend, send_buf, nxt), dist.P2POp(dist.irecv, recv_buf, prv)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["batched"] = recv_buf

    # Both directions at once with isend/irecv, waited in the reverse order.
    fwd = _to(ctx, float_input(seed, ctx.rank, "ring-fwd", (3,), torch.float64))
    back_from_next = torch.empty_like(fwd)
    fwd_from_prev = torch.empty_like(fwd)
    works = [
        dist.irecv(fwd_from_prev, src=prv),
        dist.irecv(back_from_next, src=nxt),
        dist.isend(fwd, dst=nxt),
        dist.isend(fwd * -1, dst=prv),
    ]
    for work in reversed(works):
        work.wait()
    out["fwd"] = fwd_from_prev
    out["back"] = back_from_next

    # Blocking, ordered so that no two neighbours both send first; with an odd
    # ring the last stage pairs as a receiver-first with stage 0.
    token = _to(ctx, int_input(seed, ctx.rank, "ring-token", (2,), 0, 50))
    got = torch.empty_like(token)
    sends_first = stage % 2 == 0 and not (stages % 2 == 1 and stage == stages - 1)
    if sends_first:
        dist.send(token, dst=nxt)
        dist.recv(got, src=prv)
    else:
        dist.recv(got, src=prv)
        dist.send(token, dst=nxt)
    out["ordered"] = got

    # Group-relative peers on an explicit group.
    if ctx.layout is not None and ctx.layout.pp > 1:
        group = ctx.groups.pp
        via_group = torch.empty(2, device=ctx.device)
        mine = _to(ctx, float_input(seed, ctx.rank, "ring-group", (2,)))
        reqs = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.irecv, via_group, group=group, group_peer=(stage - 1) % stages),
                dist.P2POp(dist.isend, mine, group=group, group_peer=(stage + 1) % stages),
            ]
        )
        for work in reqs:
            work.wait()
        out["group_peer"] = via_group
    return out


# --------------------------------------------------------------------------- #
# Asynchronous collectives and a mixed training-like step
# --------------------------------------------------------------------------- #


@program
def async_collectives(ctx: RankContext, seed: int) -> dict[str, Any]:
    """Several collectives in flight on different groups, waited out of order."""
    pending: list[tuple[str, Any, Any]] = []
    for axis, group in axis_groups(ctx):
        n = len(members(group))
        a = _to(ctx, int_input(seed, ctx.rank, f"as-ar-{axis}", (4,), -30, 30))
        pending.append((f"{axis}/all_reduce", a, dist.all_reduce(a, group=group, async_op=True)))
        g = torch.empty(n * 2, dtype=torch.int64, device=ctx.device)
        mine = _to(ctx, int_input(seed, ctx.rank, f"as-ag-{axis}", (2,), -30, 30))
        work = dist.all_gather_into_tensor(g, mine, group=group, async_op=True)
        pending.append((f"{axis}/all_gather", g, work))
        b = _to(ctx, float_input(seed, ctx.rank, f"as-bc-{axis}", (3,)))
        work = dist.broadcast(b, src=members(group)[0], group=group, async_op=True)
        pending.append((f"{axis}/broadcast", b, work))
    out: dict[str, Any] = {}
    for name, tensor, work in reversed(pending):
        work.wait()
        out[name] = tensor
    barrier_work = dist.barrier(async_op=True)
    barrier_work.wait()
    out["barrier_completed"] = barrier_work.is_completed()
    return out


@program
def mixed_step(ctx: RankContext, seed: int) -> dict[str, Any]:
    """A toy tensor/pipeline/data-parallel step: row-parallel matmul, stage hand-off, grad averaging."""
    if ctx.layout is None:
        return {}
    lay, c = ctx.layout, ctx.coords
    assert c is not None
    x_shard = _to(ctx, float_input(seed, lay.rank_of(tp=c.tp, cp=c.cp, dp=c.dp), "mx-x", (2, 3)))
    w_shard = _to(ctx, float_input(seed, c.tp * 100 + c.pp, "mx-w", (3, 4)))
    # Row-parallel linear: partial products summed over tp.
    y = x_shard @ w_shard
    dist.all_reduce(y, group=ctx.groups.tp)

    # Pipeline: stage s adds its output to what the previous stage sent.
    stage, stages = c.pp, lay.pp
    if stages > 1:
        incoming = torch.zeros_like(y)
        if stage > 0:
            dist.recv(incoming, src=lay.rank_of(tp=c.tp, cp=c.cp, dp=c.dp, pp=stage - 1))
        y = y + incoming
        if stage < stages - 1:
            dist.send(y, dst=lay.rank_of(tp=c.tp, cp=c.cp, dp=c.dp, pp=stage + 1))

    # "Gradients": averaged over data and context parallel replicas.
    grad = (y.sum(dim=0, keepdim=True).T @ torch.ones(1, 2, device=ctx.device)) / (stage + 1)
    dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.groups.dp_cp)
    grad /= len(lay.group_of("dp_cp", ctx.rank))

    # Token counts ride an integer all_reduce over dp, as in a real loss.
    count = torch.tensor([x_shard.numel() + ctx.rank], device=ctx.device)
    dist.all_reduce(count, group=ctx.groups.dp)

    # The model-parallel group agrees on the largest gradient magnitude.
    norm = grad.abs().max().reshape(1)
    dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=ctx.groups.mp)
    return {"y": y, "grad": grad, "count": count, "norm": norm}


@program
def identity(ctx: RankContext, seed: int) -> dict[str, Any]:
    """What each world says about its own groups: ranks, sizes, members."""
    out: dict[str, Any] = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "ctx": (ctx.rank, ctx.world_size, tuple(ctx.coords) if ctx.coords else None),
    }
    for axis, group in axis_groups(ctx):
        out[axis] = (group_rank(group), members(group), dist.get_world_size(group))
    return out
