"""One run, from the call to its outcome.

``options`` (validated ``RunOptions``), ``world`` (the shared state: groups,
scheduler, store, per-call hooks), ``rank`` (a rank thread's life and its helpers' end), ``watchdog`` (joining
and interrupting threads), ``outcome`` (what the run returns or raises),
``observers`` (CommStats, explore, trace files) and ``runner`` (``run``).
"""

from .observers import RunObserver, observe
from .options import DEFAULT_TIMEOUT_S, OPTION_NAMES, RunOptions, resolve_world
from .runner import run, run_with_options

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "OPTION_NAMES",
    "RunObserver",
    "RunOptions",
    "observe",
    "resolve_world",
    "run",
    "run_with_options",
]
