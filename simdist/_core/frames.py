"""Every thread's current frame, without CPython 3.11's collector deadlock.

``sys._current_frames()`` holds the interpreter's thread-list lock while it
makes frame objects; making one can start a garbage collection, and
collecting a ``threading.local`` takes that same lock again: the process hangs
for good, GIL held, watchdog included (CPython gh-106883; 3.11.9 and 3.12
disable the collector for the call). simdist reads every thread's frame in
its reports while ranks drop thread-locals all the time (a parked thread's
reset drops them all), and this machine's 3.11.7 hung a test run so: the
collector is paused here for the call on every version.
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
