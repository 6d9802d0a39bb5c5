"""simdist.explore compares outcomes canonically: tensors bitwise (a NaN is
the same NaN), errors by type and the set of ranks that raised, so a
divergence means a real race and nothing else."""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdist

TIMEOUT = 60.0


def nan_body(ctx: simdist.RankContext) -> tuple[torch.Tensor, float]:
    t = torch.tensor([float("nan"), 1.0, -0.0])
    dist.all_reduce(t)
    return t, float("nan")


def test_bitwise_identical_results_holding_nan_are_no_divergence() -> None:
    found = simdist.explore(nan_body, world_size=3, schedules=4, timeout=TIMEOUT)
    assert not found.found, str(found)


def sign_of_zero_body(ctx: simdist.RankContext, box: list[float]) -> torch.Tensor:
    # The last rank to write decides the sign of zero: a real race, which
    # == on tensors cannot see (-0.0 == 0.0) but bitwise comparison does.
    box[0] = -0.0 if ctx.rank == 0 else 0.0
    dist.barrier()
    return torch.tensor([box[0]])


def test_a_race_visible_only_in_the_bits_is_found() -> None:
    found = simdist.explore(
        sign_of_zero_body, world_size=2, schedules=12, args=([1.0],), share_args=True, timeout=TIMEOUT
    )
    assert found.found
    assert "tensors differ" in found.what


def doomed_pair_body(ctx: simdist.RankContext) -> int:
    # Ranks 2 and 3 wait for messages rank 0 never sends: a deadlock under
    # every schedule, whose first line names whichever of them blocked first.
    if ctx.rank >= 2:
        dist.recv(torch.zeros(1), src=0)
    return ctx.rank


def test_a_deterministic_deadlock_is_no_divergence() -> None:
    found = simdist.explore(doomed_pair_body, world_size=4, schedules=12, timeout=TIMEOUT)
    assert not found.found, str(found)
    assert str(found.baseline).startswith("DeadlockError: ")


def first_comer_fails_body(ctx: simdist.RankContext, box: list[int]) -> int:
    # Each run counts on from the last one's world_size arrivals; whoever
    # arrives first in this run fails: which rank fails is a race.
    n = box[0]
    box[0] += 1
    if n % ctx.world_size == 0:
        raise ValueError("came first")
    return ctx.rank


def test_errors_on_different_ranks_are_a_divergence() -> None:
    found = simdist.explore(
        first_comer_fails_body, world_size=3, schedules=12, args=([0],), share_args=True, timeout=TIMEOUT
    )
    assert found.found
    assert str(found.baseline).startswith("RankError: ") and str(found.outcome).startswith("RankError: ")
    assert found.baseline != found.outcome
