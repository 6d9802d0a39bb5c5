"""A one-way flag threads can wait on: ``threading.Event``'s set/is_set/wait, built on one lock.

A run makes a few of these per rank (the seat a rank's task sits in, the
rank's own end, the world's abort). ``threading.Event`` builds a
``Condition`` for each (about 2.3 us, and a waiter list); a latch is one
``_thread`` lock held from the start and released once by ``set``, so a
waiter acquires it and passes it on at once. It is never cleared.
"""

from __future__ import annotations

import _thread
import threading

__all__ = ["Latch"]


class Latch:
    """Set once, never cleared; ``wait`` returns whether it is set."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        self._release()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set, or for ``timeout`` seconds (None: no limit); as
        ``Event.wait``, a signal handler's exception (Ctrl-C) ends it."""
        if self._set:
            return True
        if timeout is None:
            got = self._lock.acquire()
        elif timeout <= 0:
            got = self._lock.acquire(False)
        else:
            got = self._lock.acquire(True, min(timeout, threading.TIMEOUT_MAX))
        if got:
            self._release()  # the next waiter's turn: every waiter passes once set
        return self._set

    def _release(self) -> None:
        # Two setters racing, or a setter and a waiter passing it on, may
        # release it once more than it was taken: it is set either way.
        try:
            self._lock.release()
        except RuntimeError:
            pass
