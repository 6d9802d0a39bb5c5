"""simdist.explore: a race on shared state shows up as a schedule that differs."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import simdist

TIMEOUT = 60.0


class Box:
    value = -1


def last_writer_body(ctx: simdist.RankContext) -> int:
    Box.value = ctx.rank  # shared by every rank unless made rank-local
    dist.barrier()
    return Box.value


def test_a_race_on_a_shared_attribute_is_found_and_replays() -> None:
    found = simdist.explore(last_writer_body, world_size=3, schedules=10, seed=100, timeout=TIMEOUT)
    assert found.found
    # Rank order: ranks 0 and 1 block in the barrier, rank 2 writes last.
    assert found.baseline == [2, 2, 2]
    assert found.outcome != [2, 2, 2] and len(set(found.outcome)) == 1
    assert 100 <= found.schedule_seed < 110
    assert f"schedule_seed={found.schedule_seed}" in str(found)
    replay = simdist.run(
        last_writer_body, world_size=3, schedule="random", schedule_seed=found.schedule_seed, timeout=TIMEOUT
    )
    assert replay == found.outcome


def test_rank_local_state_makes_every_schedule_agree() -> None:
    found = simdist.explore(
        last_writer_body, world_size=3, schedules=6, rank_local=[(Box, "value")], timeout=TIMEOUT
    )
    assert not found.found and found.schedules == 6
    assert found.baseline == [0, 1, 2]
    assert "no difference from rank order in 6 random schedule(s)" == str(found)


def calls_depend_on_race_body(ctx: simdist.RankContext) -> None:
    Box.value = ctx.rank
    dist.barrier()
    for _ in range(Box.value):  # every rank agrees on the count, but not across schedules
        dist.barrier()


def test_a_difference_only_in_the_calls_made_is_found_in_the_flight_record() -> None:
    found = simdist.explore(calls_depend_on_race_body, world_size=3, schedules=10, timeout=TIMEOUT)
    assert found.found
    assert found.baseline == found.outcome == [None, None, None]
    assert found.what.startswith("the flight record of rank 0 differs")


def test_explore_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="schedules must be a positive int, got 0"):
        simdist.explore(last_writer_body, world_size=2, schedules=0)
    with pytest.raises(TypeError, match="explore\\(\\) sets run's schedule itself"):
        simdist.explore(last_writer_body, world_size=2, schedule="rank")
