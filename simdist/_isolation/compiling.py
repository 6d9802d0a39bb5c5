"""torch.compile holds one process-wide lock while it compiles a frame
(docs/torch-state.md, "torch.compile").

Inductor waits on its compile pool's ``Future``s with dynamo's
``compile_lock`` held. Had that wait given up the run token (``helpers``),
the next rank would block on the lock outside simdist with the token in
hand, and the compiling rank never get it back. A process compiles one
frame at a time anyway, so a rank holding the lock keeps the token: its
waits on its own threads are plain waits (its helpers never need the
token), bounded by the run's timeout like any compute.
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
