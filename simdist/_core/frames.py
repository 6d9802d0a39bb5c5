"""Every thread's current frame, without CPython 3.11's collector deadlock.

``sys._current_frames()`` holds the interpreter's thread-list lock while it
makes frame objects; a garbage collection started there that frees a
``threading.local`` takes that lock again and hangs the process, GIL held
(CPython gh-106883, docs/never-hang.md). Ranks drop thread-locals all the
time, so the collector is paused for the call on every version.
"""

from __future__ import annotations

import gc
import sys
from types import FrameType


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()`` with the collector paused (if it was running)."""
    if not gc.isenabled():
        return sys._current_frames()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        gc.enable()
