"""A rank the watchdog stops right after it took a logging lock gives it back.

``logging.Handler.handle`` takes the handler's lock in a plain call before its
``try``: a stop landing just after that call used to leave the lock held for
good, and every later log call of the process through that handler hung. The
handler below holds its lock (taken by logging's own ``acquire``) while it
waits, as a thread that was stopped right there would.
"""

from __future__ import annotations

import logging
import threading
import time

import simdist

TIMEOUT = 2.0


class _SlowToAcquire(logging.Handler):
    """Takes its lock, then lingers in ``acquire`` (where the stop lands)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()

    def acquire(self) -> None:
        super().acquire()
        self.holding.set()
        while True:  # Python code: the watchdog's stop lands here, after the lock is taken
            time.sleep(0.01)

    def emit(self, record: logging.LogRecord) -> None:
        pass


def test_a_logging_lock_a_stopped_rank_held_is_free_after_the_run() -> None:
    handler = _SlowToAcquire()
    log = logging.getLogger("simdist.test.logging_locks")
    log.addHandler(handler)
    log.propagate = False
    try:

        def body(ctx: simdist.RankContext) -> None:
            if ctx.rank == 0:
                log.warning("rank 0 logs")  # never returns: stopped inside acquire

        try:
            simdist.run(body, world_size=2, timeout=TIMEOUT)
        except simdist.SimulationTimeout:
            pass
        assert handler.holding.is_set()
        free = handler.lock.acquire(timeout=10)  # bounded: on the old code it was never free
        assert free, "the handler's lock is still held by the stopped rank's thread"
        handler.lock.release()
    finally:
        log.removeHandler(handler)
        handler.close()
