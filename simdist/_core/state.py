"""A world's aborts and what its run found (deadlocks, errors, released ranks)."""

from __future__ import annotations

import threading

from ..errors import DeadlockError
from .records import copy_error
from .slots import Slots

_MAX_RECORDED = 1000


class Aborts:
    """A world-wide abort (watchdog, Ctrl-C, the run's end) and aborted communicators."""

    def __init__(self) -> None:
        self.error: BaseException | None = None  # every wait raises it
        self.event = threading.Event()
        # Set once the run is over: any later call on this world raises this.
        self.closed: str | None = None
        self.closed_error: BaseException | None = None
        # Aborted communicators: checked under the lock, so a call entering an
        # aborted group can never start a pending call nobody will complete.
        self.groups: dict[str, BaseException] = {}

    def abort_locked(self, error: BaseException, slots: Slots) -> None:
        self.error = error
        self.event.set()
        for slot in slots.ranks:
            slot.parker.unpark()
            for helper in slot.helpers:
                helper.parker.unpark()

    def fresh_error(self) -> BaseException:
        """What a wait raises once aborted: the run's end says more than the abort."""
        error = self.closed_error or self.error
        assert error is not None
        return copy_error(error)


class Findings:
    """What the run's outcome is decided from, whatever the ranks caught."""

    def __init__(self) -> None:
        # Ranks that raised out of their body because of another rank's failure.
        self.released: set[int] = set()
        # simdist errors raised inside ranks (deadlocks, mismatches, injected
        # crashes), in the order they happened: run() reports them even when
        # every rank caught them.
        self.recorded: list[tuple[int, BaseException]] = []
        self.deadlock: DeadlockError | None = None

    def record_locked(self, rank: int, error: BaseException) -> None:
        # Only the first errors matter to the outcome; a body that catches and
        # retries forever must not grow this without bound.
        if len(self.recorded) < _MAX_RECORDED:
            self.recorded.append((rank, error))

    def deadlock_found_locked(self, error: DeadlockError) -> None:
        if self.deadlock is None:
            self.deadlock = error
