"""Fuzz property of mymodel.parallel_step: any DP x TP layout equals one process.

Run it: ``simdist fuzz`` here (the target is set in pyproject.toml), or
``python -m pytest`` for a few derandomised examples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from hypothesis import given
from hypothesis import strategies as st
from mymodel import parallel_step

import simdist
from simdist import fuzz
from simdist.strategies import layouts


@dataclass(frozen=True)
class StepCase:
    """Plain data, so a failing case is a small readable JSON file."""

    tp: int
    dp: int
    rows_per_rank: int  # the batch rows of each DP rank
    columns_per_rank: int  # the output columns of each TP rank
    features: int
    seed: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepCase:
        return cls(**{name: int(data[name]) for name in cls.__dataclass_fields__})

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        batch, out = self.dp * self.rows_per_rank, self.tp * self.columns_per_rank
        x = torch.randn(batch, self.features, generator=g)
        weight = torch.randn(out, self.features, generator=g)
        y = torch.randn(batch, out, generator=g)
        return x, weight, y


@st.composite
def step_cases(draw: st.DrawFn) -> StepCase:
    layout = draw(layouts(axes=("tp", "dp"), max_world_size=4))  # a campaign's --max-world-size lowers it
    return StepCase(
        tp=layout.tp,
        dp=layout.dp,
        rows_per_rank=draw(st.integers(1, 3)),
        columns_per_rank=draw(st.integers(1, 3)),
        features=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**16)),
    )


def _rank_step(ctx: simdist.RankContext, case: StepCase) -> tuple[torch.Tensor, torch.Tensor]:
    x, weight, y = case.tensors()
    rows = slice(ctx.coords.dp * case.rows_per_rank, (ctx.coords.dp + 1) * case.rows_per_rank)
    cols = slice(ctx.coords.tp * case.columns_per_rank, (ctx.coords.tp + 1) * case.columns_per_rank)
    return parallel_step(
        x[rows],
        weight[cols],
        y[rows, cols],
        global_batch=x.shape[0],
        tp_group=ctx.groups.tp,
        dp_group=ctx.groups.dp,
    )


def _reference(case: StepCase) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step in one process, in float64: no distributed code at all."""
    x, weight, y = (t.double() for t in case.tensors())
    weight.requires_grad_(True)
    loss = ((x @ weight.T - y) ** 2).sum() / x.shape[0]
    loss.backward()
    assert weight.grad is not None
    return loss.detach(), weight.grad


@given(case=step_cases())
@fuzz.replayable(StepCase.from_json)
def test_parallel_step_matches_one_process(case: StepCase) -> None:
    fuzz.cover(tp=case.tp, dp=case.dp, world=case.tp * case.dp)
    layout = simdist.Layout(tp=case.tp, dp=case.dp)
    results = simdist.run(_rank_step, layout=layout, args=(case,))
    ref_loss, ref_grad = _reference(case)
    worst = 0.0
    for rank, (loss, grad) in enumerate(results):
        tp = layout.coords(rank).tp
        expected = ref_grad[tp * case.columns_per_rank : (tp + 1) * case.columns_per_rank]
        for got, want in ((loss, ref_loss), (grad, expected)):
            # float32 against float64: a relative error of a few float32 ulps per term.
            scale = want.abs().max().item() + 1e-6
            worst = max(worst, (got.double() - want).abs().max().item() / scale)
    # No hypothesis.target(): it would pile cases onto the layouts with the
    # largest errors (docs/fuzzing.md, "Targeted search"); layouts() reaches
    # the corners by itself.
    assert worst < 1e-4, f"a rank's loss or gradient is off by {worst:.3g} (relative) in {layout}"
