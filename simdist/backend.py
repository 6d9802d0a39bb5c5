"""Kept for imports elsewhere: the backend lives in ``simdist._backend``."""

from __future__ import annotations

from ._backend.current import _check_caller, _current, _refused, bind_current, current_world
from ._backend.process_group import BACKEND_NAME, SimProcessGroup
from ._backend.registration import WorldHooks, register_backend
from ._backend.work import SimWork

__all__ = [
    "BACKEND_NAME",
    "SimProcessGroup",
    "SimWork",
    "WorldHooks",
    "_check_caller",
    "_current",
    "_refused",
    "bind_current",
    "current_world",
    "register_backend",
]
