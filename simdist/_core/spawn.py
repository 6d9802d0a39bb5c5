"""Starting a run's new rank threads: the first starts the others.

The first thread starts every other before it runs its own target, while the
caller waits for all of them to have started: the caller is never left
blocked in ``Thread.start`` when the OS refuses a thread, and a deadline
stops the starting between two threads. Starting them in a tree was slower
(docs/internals.md, the speed audit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class StartFailed(RuntimeError):
    """A thread could not be started (the OS refused: thread or memory limits)."""


class StartTimedOut(StartFailed):
    """The deadline passed before every thread was started (thousands of ranks
    under a short timeout: the OS starts each thread, a fraction of a ms)."""

    def __init__(self, message: str, started: int) -> None:
        super().__init__(message)
        self.started = started


class ThreadStart:
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
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=name(i), daemon=True) for i in range(n)
        ]

    def _start_others(self) -> None:
        for child in range(1, self._n):
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
        if i == 0:
            self._start_others()
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
