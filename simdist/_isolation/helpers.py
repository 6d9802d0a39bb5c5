"""Helper threads belong to the rank that starts them.

On a cluster a rank is a process, and every thread it starts sees that
process's torch.distributed state. While simulations run, ``Thread.start``
called from a rank's thread (its body, or a helper of it; ThreadPoolExecutor
workers included, since the executor starts them on first ``submit``) makes
the new thread part of that rank: bound to the rank's world (its collectives
are the rank's calls), on the rank's c10d state (``is_initialized()``,
``get_rank()``, the default group), and known to the scheduler, which counts
a rank blocked only when its main thread and every live helper wait.

Helpers do not take the run token: they run alongside whichever rank holds
it. Joining a helper (``Thread.join()``) or waiting on a ``Future``
(``result()``/``exception()`` without a timeout) from a rank is a wait in
simdist, so it gives up the token and the deadlock check sees it; except
inside torch.compile's compilation, which keeps the token (``compiling``).

The patches are installed for the duration of runs only; threads started
outside any rank are untouched.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.thread
import contextlib
import threading
from typing import Any, cast

from .._core import identity
from .._core.records import ThreadExit
from .._core.scheduler import Scheduler
from .._core.slots import HelperSlot
from . import compiling, logging_locks, patches, profiler

_originals: dict[str, Any] = {}


def _owner() -> tuple[Any, int] | None:
    world = identity.me.world
    if world is None:
        return None
    return world, identity.me.rank


def _start(self: threading.Thread) -> None:
    owner = _owner()
    if owner is None or getattr(self, "_simdist_helper", None) is not None:
        return _originals["start"](self)
    world, rank = owner
    scheduler: Scheduler = world.scheduler
    state = identity.me.c10d
    executor = None
    if getattr(self, "_target", None) is concurrent.futures.thread._worker:
        executor = self._args[0]  # type: ignore[attr-defined]  # a weak reference
        if not _rank_owns(executor(), scheduler, rank):
            # A worker of a pool created outside this rank (the caller's, a
            # module's) is that pool's thread, not the rank's: left alone.
            return _originals["start"](self)
    helper = scheduler.helpers.add(rank, self.name, self.daemon, executor)
    self._simdist_helper = (scheduler, rank, helper)  # type: ignore[attr-defined]  # simdist's mark on the helper thread
    body = self.run

    def run_as_rank() -> None:
        # Its own daemon flag back before its body runs: threads it starts
        # inherit it, and the starter may not have restored it yet.
        self._daemonic = daemon  # type: ignore[attr-defined]  # CPython's private flag behind Thread.daemon
        identity.bind(world, rank, state, helper)
        helper.thread_id = threading.get_ident()
        try:
            from .. import _sanitizer  # (the room above: imported once a helper runs)

            _sanitizer.helper_started(world, rank)  # the rank's ops on this thread are checked too
            with _cuda_mode(world):  # device="cuda" means the rank's emulated device here too
                body()
        except SystemExit:
            # sys.exit()/_thread.exit() ends only this thread, silently, as in a
            # process (threading's excepthook ignores SystemExit).
            pass
        except BaseException as exc:
            world.helper_failed(rank, helper.name, exc)
        finally:
            # No stop request (the rank's end, the watchdog) can land in the
            # clean-up once the gate is shut (see ``_core.identity``).
            identity.leave(lambda: _helper_ended(scheduler, world, rank, helper))

    # The interpreter must never wait for a helper at exit: simdist waits for
    # the rank's non-daemon helpers at the rank's end, and a helper it could
    # not stop (blocked in C) would otherwise hang the test process's exit.
    # The flag is read when the thread starts; the thread's own ``daemon``
    # (what its children inherit, what the rank's end honours) is put back.
    daemon = self._daemonic  # type: ignore[attr-defined]  # CPython's private flag behind Thread.daemon
    self.run = run_as_rank  # type: ignore[method-assign]  # this one thread's run, wrapped
    self._daemonic = True  # type: ignore[attr-defined]  # CPython's private flag behind Thread.daemon
    try:
        _originals["start"](self)
    except BaseException:
        scheduler.helpers.remove(rank, helper)
        raise
    finally:
        self._daemonic = daemon  # type: ignore[attr-defined]  # CPython's private flag behind Thread.daemon


def _cuda_mode(world: Any) -> contextlib.AbstractContextManager[Any]:
    if getattr(world, "cuda_emulation", None) is None:
        return contextlib.nullcontext()
    from .._cuda.mode import emulating  # (the room above: imported once a helper runs)

    return emulating()


def _helper_ended(scheduler: Scheduler, world: Any, rank: int, helper: HelperSlot) -> None:
    from .. import _sanitizer

    _sanitizer.helper_ended(world, rank)  # nothing of Python's left in the thread's C++ state
    logging_locks.release_if_stopped()  # a stop may have landed just after logging took a lock
    profiler.close_left_open()  # the process's one profiling session must not stay taken
    scheduler.helpers.remove(rank, helper)


def forget_at_exit(thread_ids: set[int]) -> None:
    """Pool workers simdist gave up on (blocked in C): concurrent.futures joins
    every worker it knows at interpreter exit, which would hang on them."""
    # A WeakKeyDictionary (typeshed says Mapping).
    queues = cast("dict[threading.Thread, Any]", concurrent.futures.thread._threads_queues)
    for thread in list(queues):
        if thread.ident in thread_ids:
            queues.pop(thread, None)


def _join(self: threading.Thread, timeout: float | None = None) -> None:
    info = getattr(self, "_simdist_helper", None)
    owner = _owner()
    if info is not None and owner is not None and timeout is None and not compiling.holds_compile_lock():
        scheduler, rank, helper = info
        world, me = owner
        if world.scheduler is scheduler and me == rank and self is not threading.current_thread():
            scheduler.wait(rank, scheduler.helpers.join_waitable(rank, helper))
    return _originals["join"](self, timeout)


def _init_executor(self: concurrent.futures.ThreadPoolExecutor, *args: Any, **kwargs: Any) -> None:
    _originals["__init__"](self, *args, **kwargs)
    owner = _owner()
    if owner is not None and compiling.holds_compile_lock():
        # torch.compile's own pool (inductor's compile workers), made once
        # and cached for the whole process: every rank and every later run
        # compiles through it, so no rank's end may shut it down (the next
        # compile, in this run or the next, would find it shut). Its workers
        # run kernels' compilation only, never a rank's calls.
        owner = None
    # Only a pool the rank created is the rank's: its workers are the rank's
    # helpers, and the rank's end shuts it down, as a process's exit would.
    self._simdist_owner = None if owner is None else (owner[0].scheduler, owner[1])  # type: ignore[attr-defined]  # simdist's mark on the pool


def _rank_owns(executor: Any, scheduler: Scheduler, rank: int) -> bool:
    owner = getattr(executor, "_simdist_owner", None)
    return owner is not None and owner[0] is scheduler and owner[1] == rank


def _submit(
    self: concurrent.futures.ThreadPoolExecutor, fn: Any, /, *args: Any, **kwargs: Any
) -> concurrent.futures.Future:
    """A work item submitted by a rank to its own pool keeps the rank
    unblocked until a worker starts it; the worker is busy while it runs it.
    Work given to a pool from outside the rank is that pool's business: a
    wait on its Future is a plain wait (outside simdist)."""
    owner = _owner()
    if owner is None:
        return _originals["submit"](self, fn, *args, **kwargs)
    world, rank = owner
    scheduler: Scheduler = world.scheduler
    if not _rank_owns(self, scheduler, rank):
        future = _originals["submit"](self, fn, *args, **kwargs)
        future._simdist_foreign = True
        return future
    started: list[Any] = []
    pool = id(self)

    def item(*a: Any, **k: Any) -> Any:
        started.append(scheduler.helpers.item_started(rank, pool))  # the worker's slot
        try:
            return fn(*a, **k)
        finally:
            scheduler.helpers.item_returned(started[0])

    def done(f: concurrent.futures.Future) -> None:
        # Runs on the worker once the result is set (a waiter on the future
        # no longer needs the rank), or on whoever cancelled it.
        if not started:
            scheduler.helpers.item_started(rank, pool, dropped=True)
        else:
            scheduler.helpers.item_finished(started[0])

    scheduler.helpers.item_queued(rank, pool)
    try:
        future = _originals["submit"](self, item, *args, **kwargs)
    except BaseException:
        scheduler.helpers.item_started(rank, pool, dropped=True)
        raise
    future.add_done_callback(done)
    return future


def shut_down_pools(scheduler: Scheduler, rank: int, failed: bool = False) -> None:
    """As a process's exit does: executors whose workers belong to ``rank``
    stop taking work, and their idle workers leave. A rank that ``failed``
    is a process that died: its queued work items are cancelled."""
    for helper in scheduler.helpers.live(rank):
        executor = helper.executor() if helper.executor is not None else None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=failed)
        if helper.executor is not None:
            scheduler.helpers.woken(helper)


class _FutureDone(ThreadExit):
    """A wait on a Future, assumed completed by the rank's own threads; once
    the Future is done it needs nobody (its callbacks may still be running)."""

    def __init__(self, rank: int, future: concurrent.futures.Future) -> None:
        super().__init__(rank, "a concurrent.futures.Future of this rank")
        self.future = future

    def needed_ranks(self) -> Any:
        return () if self.done or self.future.done() else (self.rank,)


def _future_wait(future: concurrent.futures.Future, timeout: float | None) -> None:
    owner = _owner()
    if owner is None or timeout is not None or future.done() or getattr(future, "_simdist_foreign", False):
        return
    if compiling.holds_compile_lock():
        return  # a rank compiling keeps the token (see ``compiling``)
    world, rank = owner
    scheduler: Scheduler = world.scheduler
    waitable = _FutureDone(rank, future)
    future.add_done_callback(lambda _: scheduler.complete(rank, waitable))
    scheduler.wait(rank, waitable)


def _result(self: concurrent.futures.Future, timeout: float | None = None) -> Any:
    _future_wait(self, timeout)
    return _originals["result"](self, timeout)


def _exception(self: concurrent.futures.Future, timeout: float | None = None) -> Any:
    _future_wait(self, timeout)
    return _originals["exception"](self, timeout)


# Adopt helper threads of ranks (once for all runs: see ``patches``).
patches.register_swap(
    "helper threads",
    _originals,
    [
        (threading.Thread, "start", _start),
        (threading.Thread, "join", _join),
        (concurrent.futures.Future, "result", _result),
        (concurrent.futures.Future, "exception", _exception),
        (concurrent.futures.ThreadPoolExecutor, "submit", _submit),
        (concurrent.futures.ThreadPoolExecutor, "__init__", _init_executor),
    ],
)
