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

from .._core import identity


def release_if_stopped() -> None:
    """At a bound thread's end (its gate shut, before it unbinds): when simdist
    sent this thread a stop, release every logging lock (the module's and
    each handler's) it still owns."""
    gate = identity.me.gate
    if gate is None or not gate.stopped:
        return
    handlers = [ref() for ref in list(logging._handlerList)]  # type: ignore[attr-defined]  # private: weak references to every Handler
    for lock in [logging._lock, *(getattr(h, "lock", None) for h in handlers)]:  # type: ignore[attr-defined]  # private: logging's module lock
        owned = getattr(lock, "_is_owned", None)  # RLock's (logging's locks are RLocks)
        while owned is not None and owned():
            lock.release()
