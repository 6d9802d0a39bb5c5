"""Which rank is this thread? One record per thread, bound and unbound in one place.

A rank's main thread and every helper thread it starts serve one rank of one
run. Everything simdist needs to know about that lives here, in one
thread-local record, set by ``bind`` when the thread starts serving the rank
and cleared by ``unbind`` when it stops:

* ``world``: the run's World (None: the thread is outside every run),
* ``rank``: the global rank it serves (-1 outside),
* ``c10d``: the rank's own c10d state (``_isolation.c10d_state``),
* ``helper``: its wait slot when it is a helper thread (None for a rank's main thread),
* ``hold``: its hold on the process state, if it has one (``_isolation.rank_state``).

Readers on the hot path read ``me.<field>`` directly: the class-level
defaults of this ``threading.local`` subclass answer for a thread never bound.

Stop requests. simdist stops a thread by raising an exception in it
(``PyThreadState_SetAsyncExc``: the watchdog, Ctrl-C in the caller, a rank's
end stopping its helpers), which lands at whatever bytecode the thread runs
next, its own clean-up included (left half done, its rank would wait for it).
So ``interrupt`` sends a stop only while the thread's gate is open, at most
once per thread (one that catches it and goes on is reported as one simdist
cannot stop), and ``leave`` shuts the gate before the clean-up: a stop sent
just before is dropped (CPython keeps one pending per thread) or raised while
shutting and absorbed there, and the second shut cannot be interrupted.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any

from .frames import current_frames


class _Gate:
    """Whether simdist may still raise a stop in one thread (shared with senders)."""

    __slots__ = ("ident", "lock", "open", "stopped", "world")

    def __init__(self, ident: int, world: Any = None) -> None:
        self.ident = ident
        self.world = world
        self.lock = threading.Lock()
        self.open = True
        self.stopped = False


class Identity(threading.local):
    """This thread's record (class attributes: the values of an unbound thread)."""

    world: Any = None
    rank: int = -1
    c10d: Any = None
    helper: Any = None
    hold: Any = None
    gate: _Gate | None = None


me = Identity()

# Gates of the bound threads, by thread id: what ``interrupt`` looks up.
_gates: dict[int, _Gate] = {}
# Threads of ``_core.pool``: between tasks (parked, or tidying up) they serve
# no run, and a stop meant for the task they ran must not reach them.
_pooled: set[int] = set()


def mark_pooled(ident: int) -> None:
    _pooled.add(ident)


def forget_pooled(ident: int) -> None:
    _pooled.discard(ident)


def bind(world: Any, rank: int, c10d: Any = None, helper: Any = None) -> None:
    """This thread now serves ``rank`` of ``world`` (a rank's thread, or its helper)."""
    ident = threading.get_ident()
    gate = _Gate(ident, world)
    me.world = world
    me.rank = rank
    me.c10d = c10d
    me.helper = helper
    me.hold = None
    me.gate = gate
    _gates[ident] = gate


def unbind() -> None:
    """This thread serves no rank any more (call ``shield`` first)."""
    gate = me.gate
    if gate is not None and _gates.get(gate.ident) is gate:
        del _gates[gate.ident]
    me.__dict__.clear()  # back to the class defaults


def _set_async(ident: int, exc_type: Any) -> None:
    # None clears a pending exception (CPython takes NULL as "no exception").
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(ident), None if exc_type is None else ctypes.py_object(exc_type)
    )


# logging's handlers take a lock in a plain method (``Handler.acquire``), outside
# any ``with``: a stop landing right after that acquire leaks the lock, and
# every later log call of the process (c10d logs every failed collective)
# hangs. A stop is held back while the thread is inside logging.
_LOGGING_FILE = logging.__file__
_HOLD_BACK_S = 0.2


def _in_logging(ident: int) -> bool:
    frame = current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename == _LOGGING_FILE:
            return True
        frame = frame.f_back
    return False


def interrupt(ident: int, exc_type: type[BaseException], world: Any = None) -> None:
    """Ask the thread ``ident`` to stop by raising ``exc_type`` in it.

    A bound thread is asked at most once, and only until it shields its
    clean-up; with ``world``, only while it serves that run (a pooled thread
    may serve the next run by now); a pooled thread that serves no run is
    never asked; a thread simdist did not bind (none should be asked) is asked
    as before. A thread blocked in C only sees the request when it returns
    to Python. A thread inside ``logging`` is asked once it has left it (at
    most ``_HOLD_BACK_S`` later: a thread stuck there is asked all the same)."""
    end = time.monotonic() + _HOLD_BACK_S
    while _in_logging(ident) and time.monotonic() < end:
        time.sleep(0.001)
    gate = _gates.get(ident)
    if gate is None:
        if ident not in _pooled:
            _set_async(ident, exc_type)
        return
    if world is not None and gate.world is not world:
        return
    with gate.lock:
        if gate.open and not gate.stopped:
            gate.stopped = True
            _set_async(ident, exc_type)


class _Withdrawn(BaseException):
    """A stop taken back: raised in its own thread and caught at once (``reset_stop_flag``)."""


def reset_stop_flag() -> None:
    """Take back a stop sent to this thread that may not have landed yet, and
    reset CPython 3.11's interpreter-wide "asynchronous exception pending"
    flag, keeping every stop still on its way to another thread.

    Not by clearing the stop (``PyThreadState_SetAsyncExc(ident, NULL)``): on
    CPython 3.11 that leaves the flag set with no thread to reset it, so every
    thread then runs the eval loop's pending-work handler at each call and
    loop, for the rest of the process (Hypothesis' engine all but stops). A
    stop sent to a thread blocked in native code for good (a helper simdist
    gave up on), or to one that exits before it lands, keeps the flag set too,
    and any thread with a trace function (``sys.settrace``, coverage, pdb)
    then loops for ever at its next function entry. A stop that lands and is
    handled resets the flag, so a private exception is raised here and
    dropped; a stop pending in another thread sets the flag again when that
    thread takes the GIL back, so it still lands. Call it from a thread no
    other stop can be on its way to (the caller of a run; a thread whose gate
    is shut): a stop sent to it before the call has landed by then, since
    sending one takes the GIL and a thread checks for a stop each time it
    takes the GIL back."""
    try:
        _set_async(threading.get_ident(), _Withdrawn)
        for _ in range(1000):  # each turn checks for pending work; the first one delivers it
            pass
    except _Withdrawn:
        return
    _set_async(threading.get_ident(), None)  # never delivered (not seen so far): cleared as before


def _shut(gate: _Gate) -> None:
    with gate.lock:
        gate.open = False
        stopped = gate.stopped
    # No stop can be sent any more; one sent before may still be pending.
    if stopped:
        if gate.ident == threading.get_ident():
            reset_stop_flag()
        else:
            _set_async(gate.ident, None)


def shield() -> None:
    """From here on this thread gets no stop request (its body is over).

    Call it as the first thing of the thread's clean-up, twice if need be::

        try:
            identity.shield()
        except BaseException:  # the one stop this thread could get, just landed
            identity.shield()  # no other can come: this cannot be interrupted

    A stop lands at the next bytecode that checks for one, which may be the
    entry of ``shield`` itself, outside any ``try`` inside it; hence the
    pattern at the call site (``leave`` spells it).
    """
    gate = me.gate
    if gate is not None:
        _shut(gate)


def leave(cleanup: Any) -> None:
    """Shield this thread, run ``cleanup()``, then unbind it: the end of a
    bound thread, safe against a stop request landing anywhere in it."""
    try:
        shield()
    except BaseException:
        gate = me.gate
        if gate is None or not gate.stopped:
            raise
        shield()
    try:
        cleanup()
    finally:
        unbind()
