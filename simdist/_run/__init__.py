"""One run, from the call to its outcome.

``options`` (validated ``RunOptions``), ``world`` (the shared state: groups,
scheduler, store, per-call hooks), ``rank`` (a rank thread's life and its helpers' end), ``watchdog`` (joining
and interrupting threads), ``outcome`` (what the run returns or raises),
``observers`` (CommStats, explore, trace files) and ``runner`` (``run``).
"""

from .observers import RunObserver, observe
from .options import RunOptions
from .runner import run, run_with_options

__all__ = [
    "RunObserver",
    "RunOptions",
    "observe",
    "run",
    "run_with_options",
]
