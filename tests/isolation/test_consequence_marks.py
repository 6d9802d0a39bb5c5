"""``errors.mark_consequence``: the one way simdist marks an error delivered
because another rank failed (the deadlock check's releases, a communicator
aborted elsewhere), and what the outcome reads back through a body's wrapping."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._core.records import consequence_origin
from simdist.errors import PeerFailedError, consequence_mark, mark_consequence


def test_a_mark_is_on_the_same_error_and_read_back() -> None:
    error = PeerFailedError("released")
    assert mark_consequence(error, 3) is error
    assert consequence_mark(error) == 3
    assert consequence_mark(PeerFailedError("not marked")) is None
    assert consequence_mark(RuntimeError("a plain error, marked")) is None


def test_a_mark_is_found_through_a_bodys_wrapping_but_not_for_the_origin_itself() -> None:
    marked = mark_consequence(RuntimeError("communicator aborted"), 0)
    try:
        try:
            raise marked
        except RuntimeError as err:
            raise ValueError("the body's own wrapping") from err
    except ValueError as wrapped:
        assert consequence_origin(wrapped, 1) == 0
        assert consequence_origin(wrapped, 0) is None  # rank 0 raised it on its own


def released_by_a_crash(ctx: simdist.RankContext) -> None:
    if ctx.rank == 0:
        raise RuntimeError("rank 0 fails on its own")
    try:
        dist.all_reduce(torch.ones(1))  # never completes: rank 0 is gone
    except PeerFailedError as err:
        raise KeyError("a rank that wraps what released it") from err


def test_a_rank_released_by_a_peers_failure_is_a_consequence_however_it_wraps_it() -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(released_by_a_crash, world_size=3, timeout=60.0)
    assert sorted(info.value.failures) == [0]
    assert info.value.released == (1, 2)
