"""Which cases ran a FaultPlan that never fired: a fault case that tested a clean run.

A plan whose rules match no call (a typo'd group, an ``nth`` past the last
call) leaves the run clean, so a property about faults passes without
testing one. The worker watches every ``FaultState`` (a plan applied to one
world) created during a case, and flags the case when some plan had rules and
none of them fired. Only in campaign workers: ``simdist.run`` itself is not
changed.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["UnfiredPlans"]


class UnfiredPlans:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: list[Any] = []
        self.installed = self._install()

    def _install(self) -> bool:
        try:
            from simdist.faults import FaultState
        except ImportError:  # the fault machinery moved: nothing to watch
            return False
        original = FaultState.__init__
        watcher = self

        def init(state: Any, *args: Any, **kwargs: Any) -> None:
            original(state, *args, **kwargs)
            with watcher._lock:
                watcher._states.append(state)

        setattr(FaultState, "__init__", init)  # noqa: B010 (a method replaced on the class)
        return True

    def case_done(self) -> bool:
        """True when a plan of the case just finished had rules and none fired."""
        with self._lock:
            states, self._states = self._states, []
        return any(getattr(s.plan, "faults", None) and not s.fired for s in states)
