"""Test files the plugin tests hand to pytester, shared by the sim and real-backend tests."""

# Rank 1 fails an assertion after a collective on ``axis``; every other rank
# then waits for it in a world all-reduce, so all of them are released by it.
FAILING_RANK_ONE = """
import pytest
import torch
import torch.distributed as dist
from simdist import Layout

@pytest.mark.simdist(layout={layout})
def test_fails(ctx):
    t = torch.ones(1)
    dist.all_reduce(t, group=ctx.groups.{axis})
    if ctx.rank == 1:
        seen = int(t.item()) + 1
        assert seen == 2, "{axis} sum is off"
    dist.all_reduce(t)  # every other rank waits here for rank 1, which never comes
"""
