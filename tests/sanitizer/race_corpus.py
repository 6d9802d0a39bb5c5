"""Planted races, written the way training code writes them.

Each case is ``case(ctx, fixed)``: with ``fixed=False`` the line marked
``# RACE`` touches a buffer of an async call before its wait; with
``fixed=True`` the wait is put back before it. Each returns values a test
compares with a float64 reference, so the fixed form is checked to compute
the right thing, not only to pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

import simdist

WORLD = 2
Case = Callable[[simdist.RankContext, bool], Any]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


def _model(seed: int = 0) -> nn.Sequential:
    gen = torch.Generator().manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(4, 8, dtype=torch.float64), nn.Tanh(), nn.Linear(8, 2, dtype=torch.float64)
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def _loss(model: nn.Module, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    return model(x).square().sum()


@case
def grad_bucket_read_before_its_all_reduce(ctx: simdist.RankContext, fixed: bool) -> Any:
    """Gradient clipping computed on a flat bucket whose all-reduce is in flight."""
    model = _model()
    _loss(model, ctx.rank).backward()
    bucket = torch.cat([p.grad.flatten() for p in model.parameters()])
    work = dist.all_reduce(bucket, async_op=True)
    if fixed:
        work.wait()
    norm = bucket.norm()  # RACE
    work.wait()
    return norm


@case
def optimizer_step_before_the_last_buckets_wait(ctx: simdist.RankContext, fixed: bool) -> Any:
    """Overlapped reduction from gradient hooks; the step starts before the last wait."""
    model = _model()
    works: list[dist.Work] = []

    def reduce_now(p: torch.Tensor) -> None:
        works.append(dist.all_reduce(p.grad, async_op=True))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(reduce_now)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _loss(model, ctx.rank).backward()
    for w in works[: None if fixed else -1]:
        w.wait()
    opt.step()  # RACE
    works[-1].wait()
    return [p.detach().clone() for p in model.parameters()]


@case
def prefetched_all_gather_used_early(ctx: simdist.RankContext, fixed: bool) -> Any:
    """FSDP-style: the next layer's parameters are all-gathered ahead, and used before the wait."""
    full = torch.arange(8, dtype=torch.float64).view(2, 4)
    shard = full.flatten().chunk(WORLD)[ctx.rank].clone()
    gathered = torch.empty(8, dtype=torch.float64)
    work = dist.all_gather_into_tensor(gathered, shard, async_op=True)
    x = torch.ones(3, 4, dtype=torch.float64)
    if fixed:
        work.wait()
    y = x @ gathered.view(2, 4).t()  # RACE
    work.wait()
    return y


@case
def pipeline_activation_reused_before_its_isend(ctx: simdist.RankContext, fixed: bool) -> Any:
    """A stage sends microbatch 0's activation and refills the same buffer with microbatch 1's."""
    act = torch.empty(4, dtype=torch.float64)
    if ctx.rank == 0:
        act.copy_(torch.full((4,), 1.0, dtype=torch.float64))
        send = dist.isend(act, dst=1)
        if fixed:
            send.wait()
        act.copy_(torch.full((4,), 2.0, dtype=torch.float64))  # RACE
        send.wait()
        dist.send(act, dst=1)
        return None
    first = torch.empty(4, dtype=torch.float64)
    dist.recv(first, src=0)
    second = torch.empty(4, dtype=torch.float64)
    dist.recv(second, src=0)
    return torch.stack([first, second])


@case
def recv_buffer_read_before_its_wait(ctx: simdist.RankContext, fixed: bool) -> Any:
    """A stage posts its receive early and computes on the buffer before waiting."""
    if ctx.rank == 0:
        dist.send(torch.full((4,), 3.0, dtype=torch.float64), dst=1)
        return None
    buf = torch.zeros(4, dtype=torch.float64)
    work = dist.irecv(buf, src=0)
    if fixed:
        work.wait()
    out = torch.tanh(buf)  # RACE
    work.wait()
    return out


@case
def reduce_scatter_feeding_a_sharded_optimizer_without_wait(ctx: simdist.RankContext, fixed: bool) -> Any:
    """ZeRO-style: gradients reduce-scattered into a shard the optimizer steps on."""
    grads = torch.arange(8, dtype=torch.float64) * (ctx.rank + 1)
    shard = torch.empty(8 // WORLD, dtype=torch.float64)
    param = torch.ones(8 // WORLD, dtype=torch.float64)
    work = dist.reduce_scatter_tensor(shard, grads, async_op=True)
    if fixed:
        work.wait()
    param.add_(shard, alpha=-0.1)  # RACE
    work.wait()
    return param


@case
def funcol_result_used_through_elem_bypassing_the_wait(ctx: simdist.RankContext, fixed: bool) -> Any:
    """An AsyncCollectiveTensor's inner tensor taken out and used before anything waits."""
    t = torch.full((4,), float(ctx.rank + 1), dtype=torch.float64)
    out = funcol.all_reduce(t, "sum", dist.group.WORLD)
    if fixed:
        out = funcol.wait_tensor(out)
    inner = out.elem if isinstance(out, funcol.AsyncCollectiveTensor) else out
    total = inner.sum()  # RACE
    return total


@case
def raw_functional_op_read_before_wait_tensor(ctx: simdist.RankContext, fixed: bool) -> Any:
    """The functional op called directly (async TP style): its output read before wait_tensor."""
    t = torch.full((2, 2), float(ctx.rank + 1), dtype=torch.float64)
    out = torch.ops._c10d_functional.all_gather_into_tensor(t, WORLD, dist.group.WORLD.group_name)
    if fixed:
        out = torch.ops._c10d_functional.wait_tensor(out)
    y = out @ torch.ones(2, 1, dtype=torch.float64)  # RACE
    torch.ops._c10d_functional.wait_tensor(out)
    return y


@case
def batch_isend_irecv_halo_read_early(ctx: simdist.RankContext, fixed: bool) -> Any:
    """A ring exchange (context parallel KV) whose received chunk is used before the works finish."""
    peer = (ctx.rank + 1) % WORLD
    mine = torch.full((3,), float(ctx.rank + 1), dtype=torch.float64)
    theirs = torch.empty(3, dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
    works = dist.batch_isend_irecv(ops)
    if fixed:
        for w in works:
            w.wait()
    scores = mine * theirs  # RACE
    for w in works:
        w.wait()
    return scores


@case
def moe_tokens_used_before_all_to_all_completes(ctx: simdist.RankContext, fixed: bool) -> Any:
    """Expert parallelism: dispatched tokens fed to the expert before the all-to-all's wait."""
    tokens = torch.arange(4, dtype=torch.float64) + 10 * ctx.rank
    received = torch.empty(4, dtype=torch.float64)
    work = dist.all_to_all_single(received, tokens, async_op=True)
    if fixed:
        work.wait()
    expert_out = received * 2.0  # RACE
    work.wait()
    return expert_out


@case
def zero_grad_while_the_gradient_all_reduce_is_in_flight(ctx: simdist.RankContext, fixed: bool) -> Any:
    """The next step's zero_grad runs before the last step's reduction was waited."""
    model = _model()
    _loss(model, ctx.rank).backward()
    weight = model[0].weight
    work = dist.all_reduce(weight.grad, async_op=True)
    if fixed:
        work.wait()
    model.zero_grad(set_to_none=False)  # RACE
    work.wait()
    return weight.grad.clone()


@case
def parameter_view_of_a_bucket_read_early(ctx: simdist.RankContext, fixed: bool) -> Any:
    """Gradients are views of one flat buffer (DDP's gradient_as_bucket_view); one is read early."""
    flat = torch.arange(12, dtype=torch.float64) * (ctx.rank + 1)
    w_grad, b_grad = flat[:8].view(2, 4), flat[8:]
    work = dist.all_reduce(flat, async_op=True)
    if fixed:
        work.wait()
    bias_norm = b_grad.norm()  # RACE
    work.wait()
    return torch.stack([w_grad.sum(), bias_norm])


@case
def loss_logged_before_its_all_reduce(ctx: simdist.RankContext, fixed: bool) -> Any:
    """The loss reduced for logging, read with .item() while the reduction is in flight."""
    loss = torch.tensor([float(ctx.rank + 1)], dtype=torch.float64)
    work = dist.all_reduce(loss, async_op=True)
    if fixed:
        work.wait()
    logged = loss.item()  # RACE
    work.wait()
    return torch.tensor(logged, dtype=torch.float64)


@case
def all_gather_input_scaled_in_place_before_the_wait(ctx: simdist.RankContext, fixed: bool) -> Any:
    """A shard gathered asynchronously, then rescaled in place for the local update."""
    shard = torch.full((2,), float(ctx.rank + 1), dtype=torch.float64)
    outs = [torch.empty(2, dtype=torch.float64) for _ in range(WORLD)]
    work = dist.all_gather(outs, shard, async_op=True)
    if fixed:
        work.wait()
    shard.mul_(100.0)  # RACE
    work.wait()
    return torch.cat(outs)


@case
def broadcast_weights_overwritten_by_local_init(ctx: simdist.RankContext, fixed: bool) -> Any:
    """Rank 0's weights broadcast asynchronously; another rank's own init writes into them meanwhile."""
    weight = torch.full((3,), float(ctx.rank), dtype=torch.float64)
    work = dist.broadcast(weight, src=0, async_op=True)
    if fixed:
        work.wait()
    if ctx.rank == 1:
        torch.nn.init.constant_(weight, 5.0)  # RACE
    work.wait()
    return weight


# -- what the fixed forms must compute, each rank's value from a float64 single process -----------

F64 = torch.float64


def _summed_grads() -> list[torch.Tensor]:
    total: list[torch.Tensor] | None = None
    for rank in range(WORLD):
        model = _model()
        _loss(model, rank).backward()
        g = [p.grad.detach().clone() for p in model.parameters()]
        total = g if total is None else [a + b for a, b in zip(total, g)]
    assert total is not None
    return total


def _bucket_norm() -> list[Any]:
    norm = torch.cat([g.flatten() for g in _summed_grads()]).norm()
    return [norm] * WORLD


def _stepped() -> list[Any]:
    new = [p.detach() - 0.1 * g for p, g in zip(_model().parameters(), _summed_grads())]
    return [new] * WORLD


def _all_to_all() -> list[Any]:
    tokens = [torch.arange(4, dtype=F64) + 10 * r for r in range(WORLD)]
    return [torch.cat([t[2 * j : 2 * j + 2] for t in tokens]) * 2.0 for j in range(WORLD)]


def _rows(value: torch.Tensor) -> list[Any]:
    return [value] * WORLD


EXPECTED: dict[str, Callable[[], list[Any]]] = {
    "grad_bucket_read_before_its_all_reduce": _bucket_norm,
    "optimizer_step_before_the_last_buckets_wait": _stepped,
    "prefetched_all_gather_used_early": lambda: _rows(
        torch.ones(3, 4, dtype=F64) @ torch.arange(8, dtype=F64).view(2, 4).t()
    ),
    "pipeline_activation_reused_before_its_isend": lambda: [
        None,
        torch.stack([torch.full((4,), 1.0, dtype=F64), torch.full((4,), 2.0, dtype=F64)]),
    ],
    "recv_buffer_read_before_its_wait": lambda: [None, torch.tanh(torch.full((4,), 3.0, dtype=F64))],
    "reduce_scatter_feeding_a_sharded_optimizer_without_wait": lambda: [
        1.0 - 0.1 * (torch.arange(8, dtype=F64) * 3).chunk(WORLD)[r] for r in range(WORLD)
    ],
    "funcol_result_used_through_elem_bypassing_the_wait": lambda: _rows(torch.tensor(12.0, dtype=F64)),
    "raw_functional_op_read_before_wait_tensor": lambda: _rows(
        torch.tensor([[2.0], [2.0], [4.0], [4.0]], dtype=F64)
    ),
    "batch_isend_irecv_halo_read_early": lambda: _rows(torch.full((3,), 2.0, dtype=F64)),
    "moe_tokens_used_before_all_to_all_completes": _all_to_all,
    "zero_grad_while_the_gradient_all_reduce_is_in_flight": lambda: _rows(torch.zeros(8, 4, dtype=F64)),
    "parameter_view_of_a_bucket_read_early": lambda: _rows(
        torch.stack([torch.tensor(84.0, dtype=F64), (torch.arange(8, 12, dtype=F64) * 3).norm()])
    ),
    "loss_logged_before_its_all_reduce": lambda: _rows(torch.tensor(3.0, dtype=F64)),
    "all_gather_input_scaled_in_place_before_the_wait": lambda: _rows(
        torch.tensor([1.0, 1.0, 2.0, 2.0], dtype=F64)
    ),
    "broadcast_weights_overwritten_by_local_init": lambda: [
        torch.zeros(3, dtype=F64),
        torch.full((3,), 5.0, dtype=F64),
    ],
}
