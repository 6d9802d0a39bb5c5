"""torch.compile under the default schedule (simdist/_isolation/compiling.py).

Dynamo compiles under one process-wide lock and inductor waits on its
compile pool's Futures with the lock held. Such a wait used to give up the
run token, and the next rank then blocked on the lock while holding it: with
a cold compile cache the world stalled until the watchdog ("rank [0] never
got the run token back"). The fast test recreates the pattern with the lock
itself; the slow one compiles for real with a fresh cache directory."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import simdist
from simdist._isolation import compiling


def _locked_pool_wait(ctx: simdist.RankContext) -> int:
    from torch._dynamo.convert_frame import compile_lock

    with compile_lock:  # what a rank compiling a frame holds
        if ctx.rank == 0:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                # inductor's async_compile.wait: a Future of the rank's own pool
                assert pool.submit(time.sleep, 0.2).result() is None
        return ctx.rank


def test_a_rank_waiting_on_its_pool_inside_the_compile_lock_keeps_the_token() -> None:
    assert simdist.run(_locked_pool_wait, world_size=2, timeout=30) == [0, 1]


_process_pool: list[concurrent.futures.ThreadPoolExecutor] = []


def _cached_compile_pool() -> concurrent.futures.ThreadPoolExecutor:
    """As inductor's AsyncCompile.pool(): made by whichever rank compiles first, kept for the process."""
    if not _process_pool:
        _process_pool.append(concurrent.futures.ThreadPoolExecutor(1))
    return _process_pool[0]


def _compile_through_the_cached_pool(ctx: simdist.RankContext) -> int:
    from torch._dynamo.convert_frame import compile_lock

    if ctx.rank == 1:
        time.sleep(0.05)  # rank 0 makes the pool, and may end before rank 1 uses it
    with compile_lock:
        return _cached_compile_pool().submit(lambda: ctx.rank * 10).result()


def test_a_pool_made_while_compiling_outlives_its_rank_and_its_run() -> None:
    """A rank's end shuts its own pools down, as a process's exit would; torch.compile's
    pool is the process's, cached once: every rank and every later run compiles through it
    ("cannot schedule new futures after shutdown" in the second run, or in the rank that
    finished last)."""
    _process_pool.clear()
    try:
        for _ in range(3):
            assert simdist.run(_compile_through_the_cached_pool, world_size=2, timeout=30) == [0, 10]
        assert not _process_pool[0]._shutdown  # type: ignore[attr-defined]  # the pool's own flag
    finally:
        for pool in _process_pool:
            pool.shutdown(wait=True)


def test_holds_compile_lock_reads_the_calling_threads_ownership() -> None:
    from torch._dynamo.convert_frame import compile_lock

    assert not compiling.holds_compile_lock()
    with compile_lock:
        assert compiling.holds_compile_lock()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            assert pool.submit(compiling.holds_compile_lock).result() is False
    assert not compiling.holds_compile_lock()


@pytest.mark.slow
def test_two_runs_of_two_ranks_compile_with_a_cold_cache_under_the_default_schedule(tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import torch, simdist

        def make(scale):
            def body(ctx):
                f = torch.compile(lambda x: (x * scale + 1).sin())
                return f(torch.full((4,), float(ctx.rank)))
            return body

        for scale in (2.0, 3.0):  # two runs, each compiling its own function
            out = simdist.run(make(scale), world_size=2, timeout=240)
            want = [(torch.full((4,), float(r)) * scale + 1).sin() for r in range(2)]
            assert all(torch.allclose(o, w) for o, w in zip(out, want)), out
        print("OK")
        """
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=400, env=env, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
