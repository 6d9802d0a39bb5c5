"""Who runs next: the scheduling policies of the run token.

A policy sees only the runnable ranks, never timing, so the same program,
inputs and seed give the same interleaving on every run and every machine.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from ._checks import is_int

SCHEDULES = ("rank", "random", "concurrent")


class Policy:
    """The run queue: ranks that became runnable, and which one runs next.

    The scheduler pushes a rank whenever it becomes runnable; an entry may go
    stale (the rank blocked again, or left), so ``pick`` checks each against
    ``runnable`` and drops stale ones. Cost per switch: O(log n) or O(1)."""

    def push(self, rank: int) -> None:
        raise NotImplementedError

    def pick(self, runnable: Callable[[int], bool]) -> int | None:
        raise NotImplementedError


class RankOrder(Policy):
    """The lowest runnable rank: what a reader of the code expects by default."""

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._queued: set[int] = set()

    def push(self, rank: int) -> None:
        if rank not in self._queued:
            self._queued.add(rank)
            heapq.heappush(self._heap, rank)

    def pick(self, runnable: Callable[[int], bool]) -> int | None:
        while self._heap:
            rank = heapq.heappop(self._heap)
            self._queued.discard(rank)
            if runnable(rank):
                return rank
        return None


class SeededRandom(Policy):
    """A uniformly random runnable rank, from a private seeded generator (never
    the global one, which belongs to the ranks)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._ranks: list[int] = []
        self._index: dict[int, int] = {}

    def push(self, rank: int) -> None:
        if rank not in self._index:
            self._index[rank] = len(self._ranks)
            self._ranks.append(rank)

    def _remove_at(self, i: int) -> int:
        rank, last = self._ranks[i], self._ranks.pop()
        del self._index[rank]
        if i < len(self._ranks):
            self._ranks[i] = last
            self._index[last] = i
        return rank

    def pick(self, runnable: Callable[[int], bool]) -> int | None:
        while self._ranks:
            rank = self._remove_at(self._rng.randrange(len(self._ranks)))
            if runnable(rank):
                return rank
        return None


def make_policy(schedule: str, seed: int) -> Policy | None:
    """The policy for ``schedule`` (None: every rank runs at once, unscheduled)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {schedule!r}")
    if not is_int(seed):
        raise TypeError(f"schedule_seed must be an int, got {type(seed).__name__}")
    if schedule == "rank":
        return RankOrder()
    if schedule == "random":
        return SeededRandom(seed)
    return None
