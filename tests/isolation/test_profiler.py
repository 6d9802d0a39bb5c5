"""torch's profiler under simdist (simdist/_isolation/profiler.py): never a crash.

Kineto keeps one profiling session per process; two rank threads inside
``torch.autograd.profiler.profile`` at once used to kill the interpreter
(SIGSEGV at ``__exit__``). Each scenario runs in a fresh interpreter, so a
crash fails its test instead of killing pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
import torch

from simdist._isolation import profiler

PRELUDE = """
import torch, torch.distributed as dist, simdist
from simdist import RankError, UnsupportedOperationError
"""


def run_program(body: str, env: dict[str, str] | None = None) -> str:
    """Run ``body`` in a fresh interpreter; its stdout. A crash (a signal) or
    any non-zero exit fails the test with the program's stderr."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    return done.stdout


def test_two_ranks_profiling_a_collective_at_once_each_see_their_own_events() -> None:
    """Every rank inside a profiler at once (PyTorch's own c10d tests do it):
    no crash, each rank's session holds its own ops and its own gloo-named
    collective event (asynchronous, with the input shapes), never a peer's.
    Before, the second rank was refused (earlier still: SIGSEGV)."""
    out = run_program(
        """
        def body(ctx):
            t = torch.ones(ctx.rank + 1, 3)
            with torch.autograd.profiler.profile(record_shapes=True) as prof:
                torch.mul(t, ctx.rank)
                dist.all_reduce(t[:1])
                dist.barrier()
            events = prof.function_events
            calls = [(e.name, e.is_async, e.input_shapes, e.count)
                     for e in events if e.name.startswith("simdist:")]
            muls = [e.input_shapes for e in events if e.name == "aten::mul"]
            return calls, muls

        for schedule in ("rank", "random", "concurrent"):
            print(schedule, simdist.run(body, world_size=3, timeout=60, schedule=schedule))
        """
    )
    for line in out.strip().splitlines():
        schedule, result = line.split(" ", 1)
        per_rank = eval(result)
        for rank, (calls, muls) in enumerate(per_rank):
            assert calls == [
                ("simdist:all_reduce", True, [[1, 3]], 1),
                ("simdist:barrier", True, [], 1),
            ], (schedule, rank)
            assert muls == [[[rank + 1, 3], []]], (schedule, rank)  # its own op, not a peer's


def test_torch_profiler_profile_in_every_rank_exports_its_own_trace(tmp_path: Any) -> None:
    out = run_program(
        f"""
        import json

        def body(ctx):
            path = {str(tmp_path)!r} + f"/rank{{ctx.rank}}.json"
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                with torch.profiler.record_function(f"mine_{{ctx.rank}}"):
                    dist.barrier()
            prof.export_chrome_trace(path)
            with open(path) as f:
                names = {{e.get("name") for e in json.load(f)["traceEvents"]}}
            return sorted(n for n in names if n and (n.startswith("mine_") or n.startswith("simdist:")))

        print(simdist.run(body, world_size=3, timeout=60))
        """
    )
    assert eval(out.strip()) == [
        ["mine_0", "simdist:barrier"],
        ["mine_1", "simdist:barrier"],
        ["mine_2", "simdist:barrier"],
    ]


def test_a_range_open_across_every_switch_ends_safely() -> None:
    """A record_function around collectives stays open while its rank gives
    up the run token and the others run (and profile) meanwhile: closing a
    session at a switch would free what that range writes into when it ends.
    glibc's MALLOC_PERTURB_ fills freed memory, so a write after free shows
    as a crash or a corrupt range here."""
    out = run_program(
        """
        def body(ctx):
            for step in range(20):
                with torch.autograd.profiler.profile() as prof:
                    with torch.autograd.profiler.record_function("around"):
                        for _ in range(3):
                            dist.all_reduce(torch.ones(4))
                spans = [e for e in prof.function_events if e.name == "around"]
                assert len(spans) == 1 and spans[0].cpu_time_total >= 0, spans
                inner = [e for e in prof.function_events if e.name == "simdist:all_reduce"]
                assert len(inner) == 3, inner
            return True

        print(simdist.run(body, world_size=4, timeout=120, schedule="random", seed=5))
        """,
        env={"MALLOC_PERTURB_": "165"},
    )
    assert out.strip() == "[True, True, True, True]"


def test_direct_kineto_sessions_of_two_threads_are_refused_not_crashed() -> None:
    """torch.autograd's _prepare_profiler/_enable_profiler are Kineto's own,
    one per process: called directly from two ranks at once, the second is
    refused with the reason (never a crash)."""
    out = run_program(
        """
        from torch.autograd import profiler as ap

        def body(ctx):
            p = ap.profile()
            config, activities = p.config(create_trace_id=False), p.kineto_activities
            ap._prepare_profiler(config, activities)
            ap._enable_profiler(config, activities)
            dist.barrier()
            ap._disable_profiler()

        try:
            simdist.run(body, world_size=2, timeout=60)
        except RankError as exc:
            print("refused:", exc.__cause__)
        """
    )
    assert "rank 1 opened a Kineto profiler session while rank 0 still has one open" in out
    assert "one session per process" in out


def test_what_needs_kinetos_own_result_is_refused_clearly() -> None:
    out = run_program(
        """
        def body(ctx):
            with torch.autograd.profiler.profile() as prof:
                dist.barrier()
            try:
                prof.kineto_results.experimental_event_tree()
            except UnsupportedOperationError as exc:
                return str(exc)

        print(simdist.run(body, world_size=2, timeout=60)[1])
        """
    )
    assert "needs Kineto's result" in out and "events(), key_averages(), export_chrome_trace" in out


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


def test_the_callers_session_and_the_ranks_sessions_each_see_their_own() -> None:
    """The caller's Kineto session around simdist.run, and every rank's own
    session inside: the caller sees its ops, each rank its own."""
    out = run_program(
        """
        def body(ctx):
            with torch.autograd.profiler.profile() as prof:
                torch.div(torch.ones(2), 2)
                dist.barrier()
            names = {e.name for e in prof.function_events}
            return "aten::div" in names, "aten::mul" in names

        with torch.autograd.profiler.profile() as outer:
            print("ranks saw", simdist.run(body, world_size=2, timeout=60))
            torch.mul(torch.ones(2), 2)
        names = {e.name for e in outer.function_events}
        print("caller saw", "aten::mul" in names, "aten::div" in names)
        """
    )
    assert "ranks saw [(True, False), (True, False)]" in out
    assert "caller saw True False" in out


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


def test_a_session_nested_in_a_ranks_session_is_torchs_error_not_an_empty_outer() -> None:
    """On Kineto a nested session takes the outer one's place and the outer
    ends empty with a warning; a rank's thread-local profiler refuses the
    nested one with torch's own error, and the outer keeps its events."""
    out = run_program(
        """
        def body(ctx):
            with torch.autograd.profiler.profile() as outer:
                torch.mul(torch.ones(2), 3)
                try:
                    with torch.autograd.profiler.profile():
                        pass
                except RuntimeError as exc:
                    refused = str(exc)
            return refused, "aten::mul" in {e.name for e in outer.function_events}

        print(simdist.run(body, world_size=2, timeout=60)[0])
        """
    )
    assert out.strip() == "('Profiler is already enabled on this thread', True)"


def test_a_call_a_ranks_helper_thread_makes_is_recorded_in_the_ranks_session() -> None:
    """The rank profiles; its helper thread issues the collective (as a
    background communication thread does): the event is in the rank's
    session, once, and never in a peer's."""
    out = run_program(
        """
        import threading

        def body(ctx):
            with torch.autograd.profiler.profile() as prof:
                if ctx.rank == 0:
                    t = threading.Thread(target=lambda: dist.all_reduce(torch.ones(2)))
                    t.start()
                    t.join()
                else:
                    dist.all_reduce(torch.ones(2))
                    dist.barrier()
            if ctx.rank == 0:
                dist.barrier()
            return sorted(e.name for e in prof.function_events if e.name.startswith("simdist:"))

        print(simdist.run(body, world_size=2, timeout=60))
        """
    )
    assert eval(out.strip()) == [["simdist:all_reduce"], ["simdist:all_reduce", "simdist:barrier"]]
