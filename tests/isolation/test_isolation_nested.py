"""A run started inside a rank (a nested run): where its ranks' generators start.

docs/scheduling.md promises: the inner run's ranks start from the generator state of
the outermost caller (the values the outer run captured at its start), not
from the state of the rank that started the inner run; and the outer ranks'
own state is untouched by the inner run.
"""

from __future__ import annotations

import torch

import simdist


def _first_draw(seed: int) -> float:
    return torch.rand(1, generator=torch.Generator().manual_seed(seed)).item()


def _inner(ctx: simdist.RankContext) -> float:
    return torch.rand(1).item()


def _outer(ctx: simdist.RankContext) -> tuple[float, float]:
    torch.manual_seed(100 + ctx.rank)
    [inner] = simdist.run(_inner, world_size=1, timeout=60)
    # The outer rank's own stream goes on as if the inner run never drew.
    return inner, torch.rand(1).item()


def test_a_nested_runs_ranks_start_from_the_outermost_callers_generators() -> None:
    torch.manual_seed(7)
    results = simdist.run(_outer, world_size=2, timeout=60)
    assert [inner for inner, _ in results] == [_first_draw(7)] * 2
    assert [own for _, own in results] == [_first_draw(100), _first_draw(101)]
    # The caller's generator is where it was before the outer run.
    assert torch.rand(1).item() == _first_draw(7)
