"""Which cases ran a FaultPlan that never fired: a fault case that tested a clean run.

A plan whose rules match no call (a typo'd group, an ``nth`` past the last
call) leaves the run clean, so a property about faults passes without
testing one. ``simdist.run`` itself warns (``UnfiredFaultPlanWarning``); the
campaign worker also listens for those runs (``simdist.faults.on_unfired``)
and flags the case that made them, so the summary can count them.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["UnfiredPlans"]


class UnfiredPlans:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = False
        self.installed = self._install()

    def _install(self) -> bool:
        try:
            from simdist.faults import on_unfired
        except ImportError:  # the fault machinery moved: nothing to watch
            return False
        on_unfired(self._flag)
        return True

    def _flag(self, state: Any) -> None:
        with self._lock:
            self._seen = True

    def case_done(self) -> bool:
        """True when a run of the case just finished had a plan with rules, none of which fired."""
        with self._lock:
            seen, self._seen = self._seen, False
        return seen
