"""simdist's errors cross process boundaries: a pool of processes sweeping
``simdist.run`` gets each job's error back (message, attributes, the cause
chain as text), instead of losing every pending job to BrokenProcessPool."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import errors
from simdist.faults import InjectedFault

EVERY_ERROR = [
    errors.SimulationError("plain"),
    errors.RankError("rank 1 failed", {1: ValueError("bad")}, released=[0]),
    errors.PeerFailedError("peer 1 failed"),
    errors.DeadlockError("deadlock: rank(s) [0]"),
    errors.CollectiveMismatchError("mismatch"),
    errors.BufferOverlapError("overlap"),
    errors.SimulationTimeout("timeout"),
    errors.UnsupportedOperationError("no"),
    errors.AsyncRaceError("race"),
    InjectedFault("crash"),
]


@pytest.mark.parametrize("error", EVERY_ERROR, ids=lambda e: type(e).__name__)
def test_every_error_round_trips(error: errors.SimulationError) -> None:
    try:
        raise error from KeyError("the root cause")
    except errors.SimulationError as raised:
        back = pickle.loads(pickle.dumps(raised))
    assert type(back) is type(error) and str(back) == str(error)
    assert back.cause_text is not None and "KeyError: 'the root cause'" in back.cause_text
    if isinstance(error, errors.RankError):
        assert isinstance(back, errors.RankError)
        assert back.released == (0,) and list(back.failures) == [1]
        assert isinstance(back.failures[1], ValueError) and str(back.failures[1]) == "bad"


def test_what_does_not_pickle_travels_as_text() -> None:
    lock_holder = RuntimeError("holds a lock")
    lock_holder.lock = threading.Lock()  # type: ignore[attr-defined]
    error = errors.RankError("rank 0 failed", {0: lock_holder})
    error.results = [threading.Lock(), 3]  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(error))
    assert str(back.failures[0]) == "RuntimeError: holds a lock"
    assert back.results[1] == 3 and "lock" in back.results[0]


def _failing_job(rank_to_fail: int) -> str:
    def body(ctx: simdist.RankContext) -> None:
        t = torch.ones(2)
        dist.all_reduce(t)
        if ctx.rank == rank_to_fail:
            raise ValueError(f"rank {ctx.rank} gives up")
        dist.all_reduce(t)

    simdist.run(body, world_size=3)
    return "clean"


def test_a_process_pool_sweep_gets_each_jobs_error_back() -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        futures = [pool.submit(_failing_job, r) for r in (0, 2)]
        for rank, future in zip((0, 2), futures):
            error = future.exception(timeout=120)
            assert isinstance(error, errors.RankError)
            assert list(error.failures) == [rank]
            assert f"rank {rank} gives up" in str(error) and f"rank {rank} gives up" in (
                error.cause_text or ""
            )
