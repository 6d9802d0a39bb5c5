"""The spec the rest of ``sys.meta_path`` gives, for simdist's own finders.

simdist puts finders on ``sys.meta_path`` that do not find modules
themselves: each asks the other finders for the spec and wraps its loader
(``rank_local_defaults`` records a watched module's fresh globals,
``c10d_imports`` runs torch.distributed modules against the process's c10d
state). Two such finders that both want a module (DTensor's ``_api`` is
both) would ask each other for ever; each lookup instead asks every finder
at most once, so the second finder gets the real spec and both wrappers
apply.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["spec_from_others"]

_asking = threading.local()  # ids of the finders in the middle of a lookup on this thread


def spec_from_others(finder: object, fullname: str, path: Any, target: Any = None) -> Any:
    """The first spec for ``fullname`` from the finders on ``sys.meta_path``
    other than ``finder`` and those already asking in this lookup; None if none has one."""
    busy: set[int] = _asking.__dict__.setdefault("ids", set())
    busy.add(id(finder))
    try:
        for other in sys.meta_path:
            if id(other) in busy or not hasattr(other, "find_spec"):
                continue
            spec = other.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None
    finally:
        busy.discard(id(finder))
