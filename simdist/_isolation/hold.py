"""The process hold: which thread may touch the process's state right now.

Runs in progress at the same time (from several threads, or a run nested in
a rank) share one process. A rank holds the process while it holds its run's
token and executes, so one rank of all runs executes at a time; a run's
caller holds it while it captures and restores its values.

The hold is a record (``_holder``: whose run, which thread) written under a
lock held only for an instant, inside ``with`` blocks, never a lock held
across calls. That makes it safe against asynchronous exceptions (the
watchdog's stop, Ctrl-C in the caller): an exception that lands anywhere
either comes before the record is written (the thread does not hold the
process) or after (the record names the thread, which releases it in its
clean-up, and the run's end releases it anyway). A bare lock acquired with a
timeout cannot be made so: an exception landing right after a successful
acquire leaks the lock, and every later run hangs on it. Waiters poll
(``_POLL_S``), so a stop request or Ctrl-C reaches a thread waiting for the
hold, and are woken at once when the hold is given up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._core.identity import me

_POLL_S = 0.05


class Hold:
    """One thread's hold of the process, for one run (``states``)."""

    __slots__ = ("states", "thread")

    def __init__(self, states: Any, thread: int) -> None:
        self.states = states
        self.thread = thread


_meta = threading.Lock()  # guards _holder and _waiters; held for instants only
_holder: Hold | None = None
# Threads waiting in take(): giving up the hold wakes them only when there
# are some (a run's ranks hand the token on at every switch; nobody waits).
# Counted in the same instant as the look that found the hold taken, so a
# release after that look always wakes. A count left high by an exception
# landing in between only costs a spare wake-up.
_waiters = 0
# A wake-up permit for waiters, released whenever the hold is given up
# (a stale permit costs one extra look at _holder).
_free = threading.Lock()
_free.acquire()


def _wake() -> None:
    try:
        _free.release()
    except RuntimeError:
        pass  # a permit is already pending


def take(states: Any, aborted: Callable[[], Any] = lambda: None) -> bool:
    """Hold the process for ``states``'s run; give up (False) once ``aborted()``
    says so. A thread that already holds it keeps it (now for ``states``)."""
    global _holder, _waiters
    ident = threading.get_ident()
    counted = False
    try:
        while True:
            with _meta:
                held = _holder
                if held is None or held.thread == ident:
                    if held is None or held.states is not states:
                        # The thread's last hold, when it was for this run
                        # (a rank taking the process back at every switch).
                        mine: Hold | None = me.hold
                        if mine is None or mine.states is not states or mine.thread != ident:
                            mine = Hold(states, ident)
                        _holder = held = mine
                    me.hold = held
                    return True
                if not counted:
                    _waiters += 1
                    counted = True
            if aborted() is not None:
                return False
            _free.acquire(timeout=_POLL_S)
    finally:
        if counted:
            with _meta:
                _waiters -= 1


def holds(states: Any) -> bool:
    """Whether this thread holds the process for ``states`` (the fast path of a switch)."""
    mine: Hold | None = me.hold
    return mine is not None and mine is _holder and mine.states is states


def release() -> None:
    """This thread gives up its hold, if it has one (its rank blocked in
    simdist, or left)."""
    global _holder
    # ``me.hold`` is kept for the next take: it vouches for nothing once it
    # is no longer ``_holder`` (``holds`` and ``held_states`` check both).
    with _meta:
        held = _holder
        if held is None or held.thread != threading.get_ident():
            return
        _holder = None
        waiting = _waiters
    if waiting:
        _wake()


def release_for(states: Any) -> None:
    """A run has ended: a hold its rank still has (stuck in C) is released."""
    global _holder
    with _meta:
        held = _holder
        if held is None or held.states is not states:
            return
        _holder = None
        waiting = _waiters
    if waiting:
        _wake()


def held_states() -> Any:
    """The run this thread holds the process for, or None."""
    mine: Hold | None = me.hold
    return mine.states if mine is not None and mine is _holder else None
