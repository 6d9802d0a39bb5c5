"""Fixtures shared by every test folder (see tests/README.md for the layout).

Helper modules live in tests/support/ and are put on the import path once by
pyproject's ``pythonpath`` setting, so no test patches ``sys.path``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import simdist

# Nothing here imports tests/support: `simdist replay` and campaign workers import
# this file outside pytest's configuration, where that folder is not on the path.


def sum_ranks(ctx: simdist.RankContext) -> float:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return t.item()


@pytest.fixture
def clean_world() -> Iterator[None]:
    """For tests that abuse simdist: afterwards no thread simdist started is
    alive, no default group is left initialised, and the next run works."""
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == [], f"threads left running after the run: {left}"
    assert not dist.is_initialized()
    assert simdist.run(sum_ranks, world_size=3, timeout=30.0) == [3.0, 3.0, 3.0]
