"""Rank threads are parked between runs and reused (``simdist/_core/pool.py``):
a rank of a later run must see its thread exactly as a brand-new thread would.

The reference in every test is a fresh ``threading.Thread`` reading the same
state, never a value simdist computes. Each test first runs a body that leaves
something behind in its thread, then reads that state in a second run.
"""

from __future__ import annotations

import contextvars
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

import simdist
from simdist._core import pool
from simdist._run import watchdog

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0
WORLD = 3

_local = threading.local()
_var: contextvars.ContextVar[str] = contextvars.ContextVar("simdist_reuse_test", default="unset")


class _Counting(threading.local):
    """A local whose ``__init__`` runs once per thread that touches it."""

    def __init__(self) -> None:
        self.fresh = True


_counting = _Counting()


def in_fresh_thread(read: Callable[[], Any]) -> Any:
    """What ``read()`` returns in a thread that never ran anything before."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(read()))
    t.start()
    t.join(TIMEOUT)
    return out[0]


def _leave_then_read(leave: Callable[[], None], read: Callable[[], Any]) -> list[Any]:
    def leaving(ctx: simdist.RankContext) -> None:
        leave()

    simdist.run(leaving, world_size=WORLD, timeout=TIMEOUT)
    return simdist.run(lambda ctx: read(), world_size=WORLD, timeout=TIMEOUT)


def _local_state() -> tuple[Any, Any]:
    return (getattr(_local, "left", "absent"), _counting.__dict__.copy())


def test_thread_locals_a_rank_set_are_gone_in_the_next_run() -> None:
    def leave() -> None:
        _local.left = "from the last run"
        _counting.fresh = False

    assert _leave_then_read(leave, _local_state) == [in_fresh_thread(_local_state)] * WORLD


def test_context_variables_a_rank_set_are_gone_in_the_next_run() -> None:
    assert _leave_then_read(lambda: _var.set("left"), _var.get) == [in_fresh_thread(_var.get)] * WORLD


def _torch_modes() -> tuple[Any, ...]:
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch._C._len_torch_function_stack(),
        torch.is_autocast_enabled("cpu"),
        str(torch.empty(0).device),
    )


def test_grad_mode_a_rank_switched_off_is_back_in_the_next_run() -> None:
    def leave() -> None:
        torch.set_grad_enabled(False)

    assert _leave_then_read(leave, _torch_modes) == [in_fresh_thread(_torch_modes)] * WORLD


class _PassThrough(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_a_rank_left_pushed_is_not_seen_by_the_next_run() -> None:
    def leave() -> None:
        _PassThrough().__enter__()  # never exited

    assert _leave_then_read(leave, _torch_modes) == [in_fresh_thread(_torch_modes)] * WORLD


def test_autocast_a_rank_left_on_is_off_in_the_next_run() -> None:
    def leave() -> None:
        torch.set_autocast_enabled("cpu", True)

    assert _leave_then_read(leave, _torch_modes) == [in_fresh_thread(_torch_modes)] * WORLD


def test_a_default_dtype_a_rank_changed_is_what_a_new_thread_sees() -> None:
    # torch's default dtype is the process's, not the thread's: a later rank
    # sees what any new thread of the process sees.
    try:
        got = _leave_then_read(lambda: torch.set_default_dtype(torch.float64), torch.get_default_dtype)
        assert got == [in_fresh_thread(torch.get_default_dtype)] * WORLD
    finally:
        torch.set_default_dtype(torch.float32)


def test_a_trace_function_a_rank_left_set_is_not_inherited() -> None:
    def leave() -> None:
        sys.settrace(lambda *a: None)

    assert _leave_then_read(leave, sys.gettrace) == [in_fresh_thread(sys.gettrace)] * WORLD


def test_a_rank_that_renamed_its_thread_does_not_rename_the_next_runs_ranks() -> None:
    def leave() -> None:
        threading.current_thread().name = "renamed"

    got = _leave_then_read(leave, lambda: threading.current_thread().name)
    assert got == [f"simdist-rank-{r}" for r in range(WORLD)]


def test_threads_started_by_a_reused_rank_are_not_daemons_and_belong_to_it() -> None:
    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)

    def body(ctx: simdist.RankContext) -> tuple[bool, float]:
        seen: list[Any] = []

        def helper() -> None:
            t = torch.ones(1)
            dist.all_reduce(t)  # a helper's collective is its rank's call
            seen.append(t.item())

        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        return thread.daemon, seen[0]

    assert simdist.run(body, world_size=WORLD, timeout=TIMEOUT) == [(False, float(WORLD))] * WORLD


def test_parked_threads_are_reused_and_never_listed() -> None:
    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    listed = set(threading.enumerate())
    if pool.idle_count() < WORLD:
        pytest.skip("the pool is full or off in this process")
    idents = simdist.run(lambda ctx: threading.get_ident(), world_size=WORLD, timeout=TIMEOUT)
    assert set(threading.enumerate()) == listed
    # Every rank ran on a thread the pool had parked (the same OS threads).
    again = simdist.run(lambda ctx: threading.get_ident(), world_size=WORLD, timeout=TIMEOUT)
    assert sorted(idents) == sorted(again)


def _os_thread_ids() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


def _parked_native_ids() -> set[int]:
    with pool._lock:
        return {w.thread.native_id for w in pool._idle if w.thread.native_id is not None}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads OS threads through /proc")
# An ended thread's own exit in threading must not fail (it did when left unlisted).
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_threads_parked_past_the_kept_number_end_once_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large world's threads are all parked (its next run starts none), but
    past ``KEEP_IDLE`` a thread left without a task for ``_PARK_S`` ends: the
    OS thread is gone, not only unlisted, and later runs still work. (Threads
    parked by earlier tests may end too, when their own minute is up: each of
    this run's threads is either still parked or gone.)"""
    world = 6
    if pool.capacity() < pool.idle_count() + world:
        pytest.skip("thread reuse is off or the pool is full in this process")
    monkeypatch.setattr(pool, "_PARK_S", 0.05)  # read by each thread as it parks
    ours = set(simdist.run(lambda ctx: threading.get_native_id(), world_size=world, timeout=TIMEOUT))
    parked = pool.idle_count()
    assert parked >= world and ours <= _parked_native_ids()
    monkeypatch.setattr(pool, "KEEP_IDLE", parked - 3)
    deadline = time.monotonic() + 10
    while pool.idle_count() > parked - 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.idle_count() <= parked - 3

    def settled() -> bool:  # an ended thread's OS exit comes just after it leaves the pool
        return not (ours - _parked_native_ids()) & _os_thread_ids()

    while not settled() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert settled()
    assert ours - _parked_native_ids(), "none of the run's threads ended"
    assert simdist.run(lambda ctx: ctx.rank, world_size=world, timeout=TIMEOUT) == list(range(world))


def test_a_parked_thread_keeps_nothing_of_its_last_run_alive() -> None:
    class Big:
        pass

    big = Big()
    ref = weakref.ref(big)
    simdist.run(lambda ctx, b: id(b), world_size=WORLD, args=(big,), share_args=True, timeout=TIMEOUT)
    del big
    import gc

    gc.collect()
    assert ref() is None


def test_a_stale_stop_for_a_parked_thread_is_dropped() -> None:
    idents = simdist.run(lambda ctx: threading.get_ident(), world_size=WORLD, timeout=TIMEOUT)
    for ident in idents:  # what a late watchdog or Ctrl-C could still send
        watchdog.raise_in(ident, simdist.SimulationError)
    for _ in range(3):
        t = simdist.run(_sum_ranks, world_size=WORLD, timeout=TIMEOUT)
        assert t == [float(sum(range(WORLD)))] * WORLD


def _sum_ranks(ctx: simdist.RankContext) -> float:
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t)
    return t.item()


def test_a_stop_meant_for_one_run_never_reaches_the_next_run_on_the_same_thread() -> None:
    first = simdist.run(lambda ctx: threading.get_ident(), world_size=WORLD, timeout=TIMEOUT)
    done = threading.Event()

    def body(ctx: simdist.RankContext) -> float:
        if ctx.rank == 0:
            for ident in first:  # the first run's world is over: its stops are void
                watchdog.raise_in(ident, simdist.SimulationError, world=object())  # type: ignore[arg-type]
            done.set()
        return _sum_ranks(ctx)

    assert simdist.run(body, world_size=WORLD, timeout=TIMEOUT) == [float(sum(range(WORLD)))] * WORLD
    assert done.is_set()


def test_a_nested_run_and_its_caller_each_get_their_own_threads() -> None:
    def inner(ctx: simdist.RankContext) -> tuple[float, str]:
        return _sum_ranks(ctx), threading.current_thread().name

    def outer(ctx: simdist.RankContext) -> list[Any]:
        mine = threading.get_ident()
        got = simdist.run(inner, world_size=2, timeout=TIMEOUT)
        got2 = simdist.run(inner, world_size=2, timeout=TIMEOUT)
        assert threading.get_ident() == mine and threading.current_thread().name == f"simdist-rank-{ctx.rank}"
        return [got, got2, _sum_ranks(ctx)]

    want = [[(1.0, "simdist-rank-0"), (1.0, "simdist-rank-1")]] * 2
    for _ in range(2):
        assert simdist.run(outer, world_size=2, timeout=TIMEOUT) == [want + [1.0]] * 2


def test_runs_from_several_threads_at_once_share_the_pool_safely() -> None:
    errors: list[BaseException] = []
    results: list[list[float]] = []
    lock = threading.Lock()

    def caller() -> None:
        try:
            for _ in range(5):
                got = simdist.run(_sum_ranks, world_size=WORLD, timeout=TIMEOUT)
                with lock:
                    results.append(got)
        except BaseException as exc:
            errors.append(exc)

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(TIMEOUT * 5)
    assert errors == [] and results == [[float(sum(range(WORLD)))] * WORLD] * 15


def test_a_rank_stuck_past_its_run_ends_when_released_and_is_never_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watchdog, "GRACE_S", 0.5)
    blocker = threading.Event()
    idents: list[int] = []

    def stuck(ctx: simdist.RankContext, gate: threading.Event) -> None:
        if ctx.rank == 1:
            idents.append(threading.get_ident())
            gate.wait()  # blocked in C: the watchdog cannot stop it

    before = set(threading.enumerate())
    with pytest.raises(simdist.SimulationTimeout):
        simdist.run(stuck, world_size=2, timeout=1.0, args=(blocker,), share_args=True)
    leftover = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert [t.name for t in leftover] == ["simdist-rank-1"]
    # The next runs do not wait for it, nor run on it.
    for _ in range(2):
        ran_on = simdist.run(lambda ctx: threading.get_ident(), world_size=4, timeout=TIMEOUT)
        assert idents[0] not in ran_on
    blocker.set()
    leftover[0].join(TIMEOUT)
    assert not leftover[0].is_alive()


def test_ctrl_c_between_runs_leaves_the_pool_working() -> None:
    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    import _thread

    with pytest.raises(KeyboardInterrupt):
        _thread.interrupt_main()
        for _ in range(1000):
            threading.Event().wait(0.001)  # the main thread runs Python: the interrupt lands
    assert simdist.run(_sum_ranks, world_size=WORLD, timeout=TIMEOUT) == [float(sum(range(WORLD)))] * WORLD


_EXIT_PROGRAM = textwrap.dedent("""
    import os, sys, threading, simdist
    import torch, torch.distributed as dist

    def body(ctx):
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    assert simdist.run(body, world_size=4) == [4.0] * 4
    if sys.argv[1] == "fork":
        pid = os.fork()
        if pid == 0:  # the parked threads do not exist here: a run starts its own
            ok = simdist.run(body, world_size=4) == [4.0] * 4
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    print("exiting with", threading.active_count(), "listed threads")
""")


@pytest.mark.parametrize("how", ["exit", "fork"])
def test_the_interpreter_exits_with_parked_threads_and_a_forked_child_runs(how: str) -> None:
    # The subprocess timeout only guards this test run from the hang under test.
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_PROGRAM, how],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore::DeprecationWarning"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "exiting with 1 listed threads" in proc.stdout, proc.stdout
    if how == "fork":
        assert "child 0" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr and "Fatal" not in proc.stderr, proc.stderr


def test_a_start_interrupted_before_its_threads_have_tasks_parks_them_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    simdist.run(lambda ctx: None, world_size=WORLD, timeout=TIMEOUT)
    if pool.idle_count() < WORLD:
        pytest.skip("the pool is full or off in this process")
    listed = set(threading.enumerate())
    parked = pool.idle_count()

    def interrupted(target: Any, i: int) -> Any:
        raise KeyboardInterrupt  # Ctrl-C while the caller hands out tasks

    monkeypatch.setattr(pool, "_bound", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.PooledStart(WORLD, lambda i: None, lambda i: f"never-{i}").start()
    monkeypatch.undo()
    end = threading.Event()
    for _ in range(1000):  # the woken threads park themselves again
        if pool.idle_count() == parked and set(threading.enumerate()) == listed:
            break
        end.wait(0.01)
    assert pool.idle_count() == parked
    assert set(threading.enumerate()) == listed
    assert simdist.run(_sum_ranks, world_size=WORLD, timeout=TIMEOUT) == [float(sum(range(WORLD)))] * WORLD
