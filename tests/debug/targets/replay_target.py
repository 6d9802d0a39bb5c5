"""A replayable property whose simdist run fails on rank 1 at its third all_reduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

import simdist
from simdist import fuzz


@dataclass(frozen=True)
class StepsCase:
    steps: int

    def to_json(self) -> dict:
        return {"steps": self.steps}

    @classmethod
    def from_json(cls, data: dict) -> StepsCase:
        return cls(int(data["steps"]))


def _body(ctx, steps):
    x = torch.ones(1)
    for step in range(steps):
        dist.all_reduce(x)
        assert not (ctx.rank == 1 and step == 2), f"planted failure at step {step}"
    return x.item()


@given(case=st.builds(StepsCase, st.integers(0, 5)))
@fuzz.replayable(StepsCase.from_json)
def test_steps_property(case: StepsCase) -> None:
    simdist.run(_body, world_size=2, args=(case.steps,), timeout=60)
