"""Handing the run token on without moving the world between CPUs
(docs/internals.md, "What a switch costs").

Left alone, the OS starts the woken holder on an idle CPU, and every switch
moves the interpreter's working set between CPUs' caches (twice the cost of
a switch on one CPU where caches are little shared). So the rank handing the
token on first pins the next holder, asleep, to its own CPU; once it runs,
the holder puts its own CPU mask back (``restore``), so a rank's compute is
never held to one CPU: three system calls a switch (4-8 us). Only on Linux
(``sched_getcpu``), with more than one CPU, and when no other thread on the
machine runs as the run starts (with every CPU busy the OS keeps ranks where
they are, and pinned, a small all_reduce took 1.1-1.45x as long).
``SIMDIST_HANDOFF_AFFINITY=0`` turns it off; a failed pin turns it off for
the run: where a thread runs never changes what it computes, or in which
order ranks run.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable


def _find_getcpu() -> Callable[[], int] | None:
    if not hasattr(os, "sched_setaffinity") or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.restype = ctypes.c_int
    getcpu.argtypes = []
    try:
        cpu = getcpu()
    except Exception:
        return None
    return getcpu if cpu >= 0 else None


_GETCPU = _find_getcpu()

# Read by every new run (a test may switch it off for one run).
ENABLED = _GETCPU is not None and os.environ.get("SIMDIST_HANDOFF_AFFINITY", "1").strip() != "0"

# The threads pinned and not yet running again: native thread id -> the mask
# each had before its pin. One map for the process: a thread takes its mask
# back whichever run pinned it (a pooled thread serves many runs).
_own: dict[int, set[int]] = {}


def restore() -> None:
    """The calling thread was woken: it may run wherever it could before it
    was pinned (called once it runs; nothing if it was not pinned)."""
    own = _own.pop(threading.get_native_id(), None)
    if own is not None:
        try:
            os.sched_setaffinity(0, own)
        except OSError:
            pass  # (its mask may have been taken away from under it: nothing to put back)


def caller_mask() -> set[int] | None:
    """The calling thread's CPU mask: what each rank thread of its run starts
    with, as a process inherits its launcher's (None where masks cannot be
    read)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return os.sched_getaffinity(0)
    except OSError:
        return None


def start_with(mask: set[int] | None) -> None:
    """A rank thread starts its run: with the run's caller's mask, whatever an
    earlier run left on a pooled thread (a new thread would have inherited the
    caller's), and no pin of a thread that had its id before."""
    _own.pop(threading.get_native_id(), None)
    if mask is not None:
        try:
            os.sched_setaffinity(0, mask)
        except OSError:
            pass  # (a mask the OS refuses now: the thread keeps the one it has)


_LOADAVG = "/proc/loadavg"
# How long one look stays the answer: back-to-back runs (a test suite's) look
# once per window, not once per run (opening and reading the file cost about
# 40 us, as much as an empty 1-rank run's scheduler).
_LOOK_S = 0.1


class _Look:
    """The last look at the machine: which file, kept open (procfs makes its
    text afresh at each read from offset 0), when, and what it said."""

    __slots__ = ("answer", "fd", "lock", "path", "when")

    def __init__(self) -> None:
        self.path: str | None = None
        self.fd: int | None = None
        self.when = -float("inf")
        self.answer = False
        self.lock = threading.Lock()


_look = _Look()


def _machine_busy() -> bool:
    """Whether a thread other than the caller is running on the machine right
    now (``/proc/loadavg``'s count of running threads, the caller's included;
    False where it cannot be read). Looked at when a run starts, at most once
    per ``_LOOK_S``: a busy machine gets no pins for that run."""
    look = _look
    # Never waited for: a run starting while another looks (two callers at
    # once) has a busy machine; a forked child whose copy of the lock stays
    # taken only loses its pins.
    if not look.lock.acquire(blocking=False):
        return True
    try:
        now = time.monotonic()
        if look.path == _LOADAVG and now - look.when < _LOOK_S:
            return look.answer
        try:
            if look.path != _LOADAVG or look.fd is None:
                _forget(look)
                look.path = _LOADAVG
                look.fd = os.open(_LOADAVG, os.O_RDONLY)
            running = os.pread(look.fd, 256, 0).split()[3].partition(b"/")[0]
            answer = int(running) > 1
        except OSError:
            _forget(look)  # opened afresh at the next look
            answer = False
        except (IndexError, ValueError):
            answer = False
        look.when, look.answer = now, answer
        return answer
    finally:
        look.lock.release()


def _forget(look: _Look) -> None:
    if look.fd is not None:
        try:
            os.close(look.fd)
        except OSError:
            pass
    look.fd = None


class Handoffs:
    """The pins of one run (off where they cannot be made or are not worth it)."""

    __slots__ = ("_getcpu", "_one", "enabled", "pins")

    def __init__(self, cpus: set[int] | None) -> None:
        """``cpus``: the caller's CPU mask (``caller_mask``), None where it
        cannot be read."""
        self.pins = 0
        getcpu = _GETCPU
        self.enabled = False
        if not ENABLED or getcpu is None or cpus is None:
            return
        if len(cpus) < 2:
            return  # the process runs on one CPU anyway
        if _machine_busy():
            return  # no idle CPU for the OS to move the next holder to
        self._getcpu = getcpu
        # One set object per CPU, made once (a switch builds none).
        self._one = {cpu: {cpu} for cpu in cpus}
        self.enabled = True

    def pin(self, native_id: int | None) -> None:
        """Keep the sleeping thread ``native_id`` to this thread's CPU, so
        that waking it next does not move it (called before waking it)."""
        if not self.enabled or native_id is None:
            return
        one = self._one.get(self._getcpu())
        if one is None:
            return  # this thread runs where the run's caller may not: leave it
        try:
            own = os.sched_getaffinity(native_id)
            os.sched_setaffinity(native_id, one)
        except OSError:
            self.enabled = False
            return
        # (A thread pinned again before it ran keeps its mask from before.)
        _own.setdefault(native_id, own)
        self.pins += 1
