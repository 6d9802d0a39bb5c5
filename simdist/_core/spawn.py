"""Starting thousands of rank threads quickly: a tree of starters.

``Thread.start`` waits until the new thread has run, so starting threads one
after another from one thread costs two OS context switches each (about
0.5-1 ms on a busy 2-core machine: 4 s for 4096 ranks). Here thread ``i``
starts threads ``FAN_OUT * i + 1 .. FAN_OUT * i + FAN_OUT`` before running
its own target, so many starts wait for the OS at once (about 4x faster).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .latch import Latch

FAN_OUT = 4


class StartFailed(RuntimeError):
    """A thread could not be started (the OS refused: thread or memory limits)."""


class StartTimedOut(StartFailed):
    """The deadline passed before every thread was started (thousands of ranks
    under a short timeout: the OS starts each thread, a fraction of a ms)."""

    def __init__(self, message: str, started: int) -> None:
        super().__init__(message)
        self.started = started


class TreeStart:
    """Build ``n`` threads running ``target(i)``; ``start()`` starts them all."""

    def __init__(
        self,
        n: int,
        target: Callable[[int], None],
        name: Callable[[int], str],
        deadline: float | None = None,
    ) -> None:
        self._n = n
        self._deadline = deadline  # time.monotonic(): no thread is started after it
        self._target = target
        self._lock = threading.Lock()
        self._started = 0
        self._done = Latch()
        self._error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=name(i), daemon=True) for i in range(n)
        ]

    def _start_children(self, i: int) -> None:
        first = FAN_OUT * i + 1
        for child in range(first, min(self._n, first + FAN_OUT)):
            try:
                if self._deadline is not None and time.monotonic() > self._deadline:
                    raise StartTimedOut("the deadline passed", self._started)
                self.threads[child].start()
            except BaseException as exc:
                with self._lock:
                    if self._error is None:
                        self._error = exc
                self._done.set()
                return

    def _run(self, i: int) -> None:
        self._start_children(i)
        with self._lock:
            self._started += 1
            if self._started == self._n:
                self._done.set()
        self._target(i)

    def start(self) -> None:
        """Start every thread; return once each has started. If the OS refused
        one, raise ``StartFailed`` (the threads that did start keep running:
        the caller must take them down)."""
        try:
            self.threads[0].start()
        except BaseException as exc:
            raise StartFailed(f"could not start thread {self.threads[0].name}: {exc}") from exc
        self._done.wait()
        if isinstance(self._error, StartTimedOut):
            raise StartTimedOut(
                f"the deadline passed with {self._started} of {self._n} threads started", self._started
            )
        if self._error is not None:
            raise StartFailed(
                f"could not start every thread ({self._started} of {self._n} started): {self._error}"
            ) from self._error
