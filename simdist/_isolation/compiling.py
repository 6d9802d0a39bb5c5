"""torch.compile holds one process-wide lock while it compiles a frame.

Dynamo compiles under ``torch._dynamo.convert_frame.compile_lock`` (an
``RLock``): one frame at a time per process. Inductor hands the kernels of a
graph to a pool (a ``ThreadPoolExecutor`` the compiling rank starts, or
worker subprocesses) and waits on their ``Future``s with the lock held. A
rank's wait on a Future of its own threads gives up the run token
(``helpers``), so the next rank ran, reached ``torch.compile`` and blocked on
the lock outside simdist with the token in hand: the compiling rank, its
Future done, never got the token back (a cold compile cache stalled the world
until the watchdog; a warm one compiles without a pool).

A process compiles one frame at a time anyway, so a rank compiling keeps the
token: its waits on its own threads while it holds the lock are plain waits
(its helpers run alongside; they never need the token), bounded by the run's
timeout like any compute.
"""

from __future__ import annotations

import sys

__all__ = ["holds_compile_lock"]


def holds_compile_lock() -> bool:
    """The calling thread is inside torch.compile's compilation (holds its lock)."""
    convert_frame = sys.modules.get("torch._dynamo.convert_frame")
    lock = getattr(convert_frame, "compile_lock", None)
    is_owned = getattr(lock, "_is_owned", None)  # RLock's owner test (private, stable since 3.2)
    return bool(is_owned is not None and is_owned())
