"""Who runs next: the scheduling policies of the run token.

A policy sees only the runnable ranks, never timing, so the same program,
inputs and seed give the same interleaving on every run and every machine.
"""

from __future__ import annotations

import random
from typing import Sequence

SCHEDULES = ("rank", "random", "concurrent")


class Policy:
    """Pick the next rank to run out of the runnable ones (sorted, never empty)."""

    def pick(self, runnable: Sequence[int]) -> int:
        raise NotImplementedError


class RankOrder(Policy):
    """The lowest runnable rank: what a reader of the code expects by default."""

    def pick(self, runnable: Sequence[int]) -> int:
        return runnable[0]


class SeededRandom(Policy):
    """A uniformly random runnable rank, from a private seeded generator (never
    the global one, which belongs to the ranks)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def pick(self, runnable: Sequence[int]) -> int:
        return runnable[self._rng.randrange(len(runnable))]


def make_policy(schedule: str, seed: int) -> Policy | None:
    """The policy for ``schedule`` (None: every rank runs at once, unscheduled)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {schedule!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"schedule_seed must be an int, got {type(seed).__name__}")
    if schedule == "rank":
        return RankOrder()
    if schedule == "random":
        return SeededRandom(seed)
    return None
