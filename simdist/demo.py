"""A small, real simulation: one training step of a TP x PP x DP MLP, checked
against the same step computed in one process without any parallelism."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ._run import run
from .context import RankContext
from .layout import Layout

HIDDEN, BATCH_PER_DP = 8, 4


def _weights(pp: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(HIDDEN, HIDDEN, generator=g, dtype=torch.float64) / HIDDEN**0.5 for _ in range(pp)]


def _batch(dp: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(99)
    return torch.randn(dp * BATCH_PER_DP, HIDDEN, generator=g, dtype=torch.float64)


def _rank_step(ctx: RankContext) -> tuple[float, torch.Tensor]:
    """Stage pp owns layer pp; its columns are split over tp; dp splits the batch."""
    layout = ctx.layout
    assert layout is not None and ctx.coords is not None
    tp, _, dp, pp = ctx.coords
    cols = HIDDEN // layout.tp
    w_full = _weights(layout.pp)[pp]
    w = w_full[:, tp * cols : (tp + 1) * cols].clone().requires_grad_(True)
    x = _batch(layout.dp)[dp * BATCH_PER_DP : (dp + 1) * BATCH_PER_DP]
    if pp > 0:  # activations arrive from the previous stage
        x = torch.empty(BATCH_PER_DP, HIDDEN, dtype=torch.float64)
        dist.recv(x, src=layout.rank_of(tp=tp, dp=dp, pp=pp - 1))
        x.requires_grad_(True)
    part = torch.tanh(x @ w)
    gathered = [torch.empty_like(part) for _ in range(layout.tp)]
    dist.all_gather(gathered, part.detach(), group=ctx.groups.tp)
    gathered[tp] = part  # keep our own slice in the graph
    y = torch.cat(gathered, dim=1)
    if pp < layout.pp - 1:
        dist.send(y.detach(), dst=layout.rank_of(tp=tp, dp=dp, pp=pp + 1))
        grad_y = torch.empty_like(y)
        dist.recv(grad_y, src=layout.rank_of(tp=tp, dp=dp, pp=pp + 1))
        # Only this rank's own slice of y carries a graph, so backward sends
        # just that slice's share of grad_y into w and x.
        y.backward(grad_y)
        loss = torch.zeros((), dtype=torch.float64)
    else:
        loss = (y**2).mean() / layout.dp
        loss.backward()
    if pp > 0:
        grad_x = x.grad
        assert grad_x is not None  # x is a leaf that took part in backward
        dist.all_reduce(grad_x, group=ctx.groups.tp)  # each tp slice holds a part of x's grad
        dist.send(grad_x, dst=layout.rank_of(tp=tp, dp=dp, pp=pp - 1))
    grad = w.grad
    assert grad is not None  # w is a leaf that took part in backward
    dist.all_reduce(grad, group=ctx.groups.dp)
    total = loss.detach().clone()
    dist.all_reduce(total, group=ctx.groups.dp)
    dist.broadcast(total, src=layout.rank_of(tp=tp, dp=dp, pp=layout.pp - 1), group=ctx.groups.pp)
    return float(total), grad


def _reference(layout: Layout) -> tuple[float, list[torch.Tensor]]:
    ws = [w.clone().requires_grad_(True) for w in _weights(layout.pp)]
    y = _batch(layout.dp)
    for w in ws:
        y = torch.tanh(y @ w)
    loss = (y**2).mean()
    loss.backward()
    return float(loss.detach()), [w.grad for w in ws]  # type: ignore[misc]  # every weight took part in the loss, so has a grad


def demo(layout: Layout | None = None) -> int:
    layout = layout or Layout(tp=2, cp=1, dp=2, pp=2)
    print(f"simdist demo: one MLP training step on {layout} = {layout.world_size} rank threads")
    start = time.perf_counter()
    results = run(_rank_step, layout=layout, timeout=60.0)
    elapsed = time.perf_counter() - start
    ref_loss, ref_grads = _reference(layout)
    cols = HIDDEN // layout.tp
    worst = 0.0
    for rank, (loss, grad) in enumerate(results):
        c = layout.coords(rank)
        expect = ref_grads[c.pp][:, c.tp * cols : (c.tp + 1) * cols]
        worst = max(worst, float((grad - expect).abs().max()), abs(loss - ref_loss))
        print(f"  rank {rank} {c}: loss {loss:.6f}  |grad| {float(grad.norm()):.6f}")
    print(
        f"single-process reference loss {ref_loss:.6f}; worst difference {worst:.2e}; "
        f"simulation took {elapsed * 1e3:.0f} ms"
    )
    ok = worst < 1e-12
    print("parity OK" if ok else "PARITY FAILED")
    return 0 if ok else 1
