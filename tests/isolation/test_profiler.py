"""torch's profiler under simdist (simdist/_isolation/profiler.py): never a crash.

Kineto keeps one profiling session per process; two rank threads inside
``torch.autograd.profiler.profile`` at once used to kill the interpreter
(SIGSEGV at ``__exit__``). Each scenario runs in a fresh interpreter, so a
crash fails its test instead of killing pytest."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from simdist._isolation import profiler

PRELUDE = """
import torch, torch.distributed as dist, simdist
from simdist import RankError, UnsupportedOperationError
"""


def run_program(body: str) -> str:
    """Run ``body`` in a fresh interpreter; its stdout. A crash (a signal) or
    any non-zero exit fails the test with the program's stderr."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    return done.stdout


def test_two_ranks_profiling_a_collective_at_once_are_refused_not_crashed() -> None:
    out = run_program(
        """
        def body(ctx):
            t = torch.ones(3)
            with torch.autograd.profiler.profile(record_shapes=True):
                dist.all_reduce(t)
            return t

        try:
            simdist.run(body, world_size=2, timeout=60)
        except RankError as exc:
            cause = exc.__cause__
            assert isinstance(cause, UnsupportedOperationError), repr(cause)
            print("refused:", cause)
        else:
            raise SystemExit("both ranks profiled at once and nothing was said")
        """
    )
    assert "rank 1 opened a torch profiler session while rank 0 still has one open" in out
    assert "one session per process" in out and "profile one rank at a time" in out


def test_torch_profiler_profile_is_refused_too() -> None:
    out = run_program(
        """
        def body(ctx):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                dist.barrier()

        try:
            simdist.run(body, world_size=3, timeout=60)
        except RankError as exc:
            print(type(exc.__cause__).__name__)
        """
    )
    assert out.split() == ["UnsupportedOperationError"]


def test_ranks_profiling_one_after_another_each_get_their_own_events() -> None:
    out = run_program(
        """
        def body(ctx):
            names = None
            for turn in range(ctx.world_size):
                if turn == ctx.rank:
                    with torch.autograd.profiler.profile() as prof:
                        torch.add(torch.ones(3), ctx.rank)
                    names = {e.name for e in prof.function_events}
                dist.barrier()
            return "aten::add" in names, torch.autograd._profiler_enabled()

        print(simdist.run(body, world_size=3, timeout=60))
        """
    )
    assert out.strip() == "[(True, False), (True, False), (True, False)]"


def test_one_rank_profiling_sees_only_its_own_thread() -> None:
    out = run_program(
        """
        def body(ctx):
            if ctx.rank == 0:
                with torch.autograd.profiler.profile() as prof:
                    dist.barrier()
                return sorted({e.name for e in prof.function_events if e.name.startswith("aten::")})
            dist.barrier()
            torch.mul(torch.ones(2), 2)  # rank 1's op: not in rank 0's session
            return None

        print(simdist.run(body, world_size=2, timeout=60)[0])
        """
    )
    assert "aten::mul" not in out


def test_the_callers_open_session_counts_and_keeps_working() -> None:
    out = run_program(
        """
        def body(ctx):
            with torch.autograd.profiler.profile():
                pass

        with torch.autograd.profiler.profile() as outer:
            try:
                simdist.run(body, world_size=2, timeout=60)
            except RankError as exc:
                print("refused:", exc.__cause__)
            torch.mul(torch.ones(2), 2)
        print("caller saw", "aten::mul" in {e.name for e in outer.function_events})
        """
    )
    assert "while the caller's thread 'MainThread' still has one open" in out
    assert "caller saw True" in out


def test_a_session_left_open_in_a_rank_does_not_carry_into_the_next_run() -> None:
    """Issue 28 point 1's profiler part: parked rank threads are reused; the
    session one left open is closed when its task ends."""
    out = run_program(
        """
        def leave_open(ctx):
            torch.autograd.profiler.profile().__enter__()
            dist.barrier()

        def look(ctx):
            inherited = torch.autograd._profiler_enabled()
            with torch.autograd.profiler.profile():  # the process's session is free again
                pass
            return inherited, torch.autograd._profiler_enabled()

        simdist.run(leave_open, world_size=1, timeout=60)
        print(simdist.run(look, world_size=2, timeout=60))
        """
    )
    assert out.strip() == "[(False, False), (False, False)]"


def test_a_helper_leaving_its_session_open_frees_it_at_its_end() -> None:
    out = run_program(
        """
        import threading

        def body(ctx):
            if ctx.rank == 0:
                t = threading.Thread(target=lambda: torch.autograd.profiler.profile().__enter__())
                t.start()
                t.join()
            dist.barrier()
            if ctx.rank == 1:
                with torch.autograd.profiler.profile():
                    pass
            return True

        print(simdist.run(body, world_size=2, timeout=60))
        """
    )
    assert out.strip() == "[True, True]"


def test_close_left_open_closes_only_the_calling_threads_session() -> None:
    seen: list[bool] = []

    def thread_body() -> None:
        torch.autograd.profiler.profile().__enter__()
        seen.append(torch.autograd._profiler_enabled())
        seen.append(profiler.close_left_open())
        seen.append(torch.autograd._profiler_enabled())
        seen.append(profiler.close_left_open())

    t = threading.Thread(target=thread_body)
    t.start()
    t.join()
    assert seen == [True, True, False, False]
    assert profiler.holder() is None


@pytest.mark.parametrize("name", ["_prepare_profiler", "_enable_profiler", "_disable_profiler"])
def test_outside_runs_torch_profiler_is_torchs_own(name: str) -> None:
    import torch.autograd.profiler as autograd_profiler

    assert not getattr(autograd_profiler, name).__module__.startswith("simdist")
