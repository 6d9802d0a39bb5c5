"""Differentiable collectives, unmodified: ``torch.distributed.nn.functional``
and ``torch.distributed._functional_collectives``' autograd variants.

Every rank computes its own nonlinear loss of the collective's output and runs
backward; the gradient reaching each rank's input is the derivative of the sum
of all ranks' losses, which one process computes directly from the
concatenated/summed inputs (float64, no collective involved).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.nn.functional as dnnf

import simdist

WORLD = 4
ROWS = 2 * WORLD  # divides into WORLD chunks
COLS = 3


def rank_input(rank: int) -> torch.Tensor:
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(40 + rank), dtype=torch.float64)


def rank_loss(out: torch.Tensor, rank: int) -> torch.Tensor:
    coef = torch.randn(out.shape, generator=torch.Generator().manual_seed(70 + rank), dtype=torch.float64)
    return (coef * out).sum() + 0.1 * (rank + 1) * (out**2).sum()


def _wait(t: torch.Tensor) -> torch.Tensor:
    return funcol.wait_tensor(t) if isinstance(t, funcol.AsyncCollectiveTensor) else t


# name: (what each rank calls, what that rank's output is in terms of every rank's input)
OPS: dict[
    str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[list[torch.Tensor], int], torch.Tensor]]
] = {
    "nn.all_reduce": (lambda x: dnnf.all_reduce(x), lambda xs, r: sum(xs)),
    "nn.all_gather": (lambda x: torch.cat(dnnf.all_gather(x)), lambda xs, r: torch.cat(xs)),
    "nn.reduce_scatter": (
        lambda x: dnnf.reduce_scatter(torch.empty(ROWS // WORLD, COLS, dtype=x.dtype), list(x.chunk(WORLD))),
        lambda xs, r: sum(x.chunk(WORLD)[r] for x in xs),
    ),
    "nn.all_to_all_single": (
        lambda x: dnnf.all_to_all_single(torch.empty_like(x), x),
        lambda xs, r: torch.cat([x.chunk(WORLD)[r] for x in xs]),
    ),
    "funcol.all_gather_tensor_autograd": (
        lambda x: _wait(funcol.all_gather_tensor_autograd(x, 0, dist.group.WORLD)),
        lambda xs, r: torch.cat(xs),
    ),
    "funcol.reduce_scatter_tensor_autograd": (
        lambda x: _wait(funcol.reduce_scatter_tensor_autograd(x, "sum", 0, dist.group.WORLD)),
        lambda xs, r: sum(x.chunk(WORLD)[r] for x in xs),
    ),
    "funcol.all_to_all_single_autograd": (
        lambda x: _wait(funcol.all_to_all_single_autograd(x, None, None, dist.group.WORLD)),
        lambda xs, r: torch.cat([x.chunk(WORLD)[r] for x in xs]),
    ),
}
# The names torch 2.13 recommends instead of the deprecated ones above (older
# torch has only those): the same semantics.
if hasattr(funcol, "all_gather_single_autograd"):
    OPS["funcol.all_gather_single_autograd"] = (
        lambda x: _wait(funcol.all_gather_single_autograd(x, 0, dist.group.WORLD)),
        lambda xs, r: torch.cat(xs),
    )
    OPS["funcol.reduce_scatter_single_autograd"] = (
        lambda x: _wait(funcol.reduce_scatter_single_autograd(x, "sum", 0, dist.group.WORLD)),
        lambda xs, r: sum(x.chunk(WORLD)[r] for x in xs),
    )
    OPS["funcol.all_reduce"] = (  # differentiable on the torch that has the names above
        lambda x: _wait(funcol.all_reduce(x, "sum", dist.group.WORLD)),
        lambda xs, r: sum(xs),
    )


def functional_body(ctx: simdist.RankContext, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = rank_input(ctx.rank).requires_grad_()
    out = OPS[name][0](x)
    rank_loss(out, ctx.rank).backward()
    return out.detach(), x.grad


@pytest.mark.filterwarnings("ignore:.*is deprecated:FutureWarning")  # still in wide use
@pytest.mark.parametrize("name", list(OPS))
def test_collective_gradients_equal_the_derivative_of_every_ranks_loss(name: str) -> None:
    xs = [rank_input(r).requires_grad_() for r in range(WORLD)]
    outs = [OPS[name][1](xs, r) for r in range(WORLD)]
    sum(rank_loss(out, r) for r, out in enumerate(outs)).backward()
    for r, (out, grad) in enumerate(simdist.run(functional_body, world_size=WORLD, args=(name,))):
        torch.testing.assert_close(out, outs[r].detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, xs[r].grad, rtol=1e-12, atol=1e-12)
