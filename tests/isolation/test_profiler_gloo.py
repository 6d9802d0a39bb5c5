"""A rank's profiler session on simdist against the same session in a real gloo world.

``profiler_programs.profiled_calls`` profiles a dozen collectives and
point-to-point calls on every rank (both profiler APIs) and returns the
events gloo's own profiling adds (name, asynchronous, input shapes, count)
and whether the rank's own op and range are there. What gloo gives is the
reference; simdist must give the same, rank by rank, under every schedule.
"""

from __future__ import annotations

import functools
from typing import Any

import profiler_programs
import pytest

import simdist
from simdist.launch import run_processes

pytestmark = pytest.mark.gloo

WORLD = 3


@functools.cache
def _gloo(kind: str) -> list[dict[str, Any]]:
    return run_processes(profiler_programs.profiled_calls, args=(kind,), timeout=300, world_size=WORLD)


@pytest.mark.parametrize("kind", ["autograd", "torch"])
@pytest.mark.parametrize("schedule", ["rank", "random", "concurrent"])
def test_each_ranks_profile_matches_gloos(kind: str, schedule: str) -> None:
    expected = _gloo(kind)
    assert all(r["gloo"] and r["own_range"] and r["mul"] for r in expected)  # the reference saw them
    got = simdist.run(
        profiler_programs.profiled_calls, args=(kind,), world_size=WORLD, timeout=120, schedule=schedule
    )
    for rank in range(WORLD):
        assert got[rank] == expected[rank], rank
