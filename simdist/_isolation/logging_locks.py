"""Logging's locks given back by a thread simdist stopped.

A stop is an exception raised in a thread at whatever bytecode it runs next
(``_core.identity``). ``logging`` takes its locks in plain method calls
outside any ``with`` (``Handler.handle``: ``self.acquire()`` then ``try``):
a stop landing right after such an acquire leaves the lock held by a thread
that will never release it, and every later log call of the process (c10d
logs each failed collective) hangs. ``identity.interrupt`` holds a stop back
while the thread is inside logging, but a thread that enters logging just
after that look (or stays in it too long) is stopped all the same.

So a stopped thread, once its body has unwound (every ``with`` and
``finally`` of its frames has run), releases any logging lock it still owns:
whatever it holds then is held by no frame, only leaked.
"""

from __future__ import annotations

import logging
from typing import Any

from .._core import identity


def _locks() -> list[Any]:
    found = [logging._lock]  # type: ignore[attr-defined]  # private: logging's module lock
    for ref in list(logging._handlerList):  # type: ignore[attr-defined]  # private: weak references to every Handler
        handler = ref()
        lock = getattr(handler, "lock", None)
        if lock is not None:
            found.append(lock)
    return found


def release_leaked() -> int:
    """Release every logging lock (module and handlers') this thread still
    owns; returns how many acquisitions were given back."""
    released = 0
    for lock in _locks():
        owned = getattr(lock, "_is_owned", None)  # RLock's (logging's locks are RLocks)
        while owned is not None and owned():
            lock.release()
            released += 1
    return released


def release_if_stopped() -> None:
    """At a bound thread's end (its gate shut, before it unbinds): release
    what ``release_leaked`` finds, when simdist sent this thread a stop."""
    gate = identity.me.gate
    if gate is not None and gate.stopped:
        release_leaked()
