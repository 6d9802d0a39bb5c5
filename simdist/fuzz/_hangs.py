"""A worker's guards against a target that never returns or leaves threads behind.

A case that runs past its deadline cannot be stopped from Python (it may be
blocked in C), so the guard reports it as a failure, with the case and the
stuck stack, and ends the worker process: the campaign then counts a failure,
never a clean run. Threads a property's round started and left running are
reported once per property.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

from .._core.frames import current_frames

__all__ = ["EXIT_HUNG_CASE", "CaseDeadline", "exit_now", "leaked_threads", "main_thread_stack"]

# A worker that ended itself at a case past its deadline (a failure it has
# already reported): not a crash.
EXIT_HUNG_CASE = 75


class CaseDeadline:
    """Calls ``on_hang(seconds)`` once when no case finished for ``seconds`` during a round."""

    def __init__(self, seconds: float, on_hang: Callable[[float], None]) -> None:
        self.seconds = seconds
        self._on_hang = on_hang
        self._lock = threading.Lock()
        self._since: float | None = None
        self._thread = threading.Thread(target=self._watch, name="simdist-fuzz-case-deadline", daemon=True)
        self._thread.start()

    def progress(self) -> None:
        """A round started or a case finished: the clock restarts."""
        with self._lock:
            self._since = time.monotonic()

    def idle(self) -> None:
        with self._lock:
            self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(0.2, self.seconds / 4))
            with self._lock:
                since = self._since
            if since is not None and time.monotonic() - since > self.seconds:
                self._on_hang(self.seconds)
                return

    @property
    def thread(self) -> threading.Thread:
        return self._thread


def main_thread_stack() -> str:
    frame = current_frames().get(threading.main_thread().ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"


def leaked_threads(before: set[int], ignore: set[int], wait: float = 0.5) -> list[str]:
    """Threads started since ``before`` that are still alive after up to ``wait`` seconds."""
    limit = time.monotonic() + wait
    new = [t for t in threading.enumerate() if t.ident not in before and t.ident not in ignore]
    for t in new:
        t.join(max(0.0, limit - time.monotonic()))
    return [f"{t.name}{' (daemon)' if t.daemon else ''}" for t in new if t.is_alive()]


def exit_now(code: int) -> None:
    """End the process at once: its main thread is stuck and cannot unwind."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
