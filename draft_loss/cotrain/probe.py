"""Named points of a step where a test's probe may act (fault injection).

A probe is called with the point's name, e.g. ``"split:microbatch:1:backward"``;
whatever it raises aborts the step as any other failure there would.
"""

from __future__ import annotations

from collections.abc import Callable

Probe = Callable[[str], None]


def reach(probe: Probe | None, point: str) -> None:
    """Tells ``probe`` (if any) that the step reached ``point``."""
    if probe is not None:
        probe(point)


def prefixed(probe: Probe | None, prefix: str) -> Probe | None:
    """``probe`` seeing ``"<prefix>:<point>"`` for a sub-step's own points (None stays None)."""
    if probe is None:
        return None
    return lambda point: probe(f"{prefix}:{point}")
