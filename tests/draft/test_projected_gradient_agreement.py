"""projected_soft_cross_entropy all-reduces the hidden gradient over TP in
backward, so TP ranks must agree in forward on whether gradients flow: one rank
without a backward would leave its peers waiting in that all-reduce (a hang on
a cluster). Every rank raises the same clear error in forward instead.
"""

from __future__ import annotations

import pytest
import torch

import simdist
from draft_loss import projected_soft_cross_entropy
from simdist import Layout

TP = 3
ODD_RANK = 1
EXPECTED = (
    "projected_soft_cross_entropy: TP ranks disagree on whether gradients flow (an input requires grad, "
    "grad mode on): rank 0: yes, rank 1: no, rank 2: yes; its backward all-reduces over the TP group"
)


def _inputs(rank: int):
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, 5, 4, generator=g)
    weight = torch.randn(TP * 3, 4, generator=g)[rank * 3 : (rank + 1) * 3]
    teacher = torch.randn(2, 5, TP * 3, generator=g)[..., rank * 3 : (rank + 1) * 3]
    mask = torch.rand(2, 5, generator=g) < 0.7
    return hidden, weight, teacher, mask


def _body(ctx, how):
    hidden, weight, teacher, mask = _inputs(ctx.rank)
    needs_grad = not (ctx.rank == ODD_RANK and how == "detached")
    hidden.requires_grad_(needs_grad)
    weight.requires_grad_(needs_grad)
    grad_mode = not (ctx.rank == ODD_RANK and how == "no_grad")
    try:
        with torch.set_grad_enabled(grad_mode):
            stats = projected_soft_cross_entropy(
                hidden, weight, teacher, mask, tp_group=ctx.groups.tp, token_chunk_size=4
            )
    except ValueError as error:
        return type(error), str(error)
    # Not reached on the fixed code. The old code got here on every rank, and
    # only the odd rank would have failed in backward: stop before it.
    return None, stats.numerators.requires_grad


@pytest.mark.parametrize("how", ["detached", "no_grad"])
def test_ranks_that_disagree_on_gradients_all_raise_in_forward(how):
    results = simdist.run(_body, layout=Layout(tp=TP), args=(how,), timeout=60.0)
    for rank, (kind, message) in enumerate(results):
        assert kind is ValueError, f"rank {rank} did not raise in forward: {message!r}"
        assert message.startswith(EXPECTED), message
    assert len({message for _, message in results}) == 1, "every TP rank raises the same error"


def _agreeing_body(ctx, needs_grad):
    hidden, weight, teacher, mask = _inputs(ctx.rank)
    hidden.requires_grad_(needs_grad)
    stats = projected_soft_cross_entropy(
        hidden, weight, teacher, mask, tp_group=ctx.groups.tp, token_chunk_size=4
    )
    if needs_grad:
        stats.normalized().backward()
        return hidden.grad
    return stats.numerators.requires_grad


def test_ranks_that_agree_run_with_or_without_gradients():
    grads = simdist.run(_agreeing_body, layout=Layout(tp=TP), args=(True,), timeout=60.0)
    assert all(
        torch.equal(g, grads[0]) and bool(g.abs().sum() > 0) for g in grads
    )  # the all-reduced hidden grad
    assert simdist.run(_agreeing_body, layout=Layout(tp=TP), args=(False,), timeout=60.0) == [False] * TP
