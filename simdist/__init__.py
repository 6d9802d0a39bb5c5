"""simdist: run every rank of a DP/PP/TP/CP layout as a thread of one CPU process.

import simdist
results = simdist.run(body, layout=simdist.Layout(tp=2, dp=2, pp=2))
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import TYPE_CHECKING

from . import _version

if TYPE_CHECKING:
    from . import debug, tolerance
    from ._run import run
    from .comm_stats import CommCount, CommStats
    from .context import Groups, RankContext
    from .debug import dump
    from .errors import (
        AsyncRaceError,
        BufferOverlapError,
        CollectiveMismatchError,
        DeadlockError,
        PeerFailedError,
        RankError,
        SimulationError,
        SimulationTimeout,
        UnsupportedOperationError,
        UnwaitedWorkWarning,
    )
    from .explore import Divergence, explore
    from .faults import Fault, FaultPlan, InjectedFault, UnfiredFaultPlanWarning
    from .launch import run_processes
    from .layout import Coords, Layout
    from .reduction import RankOrder, ReductionModel, Ring, Shuffled, Tree
    from .retry import RetryOutcome, run_with_retry
    from .tolerance import ToleranceError, check_close

__all__ = [
    "AsyncRaceError",
    "BufferOverlapError",
    "CollectiveMismatchError",
    "CommCount",
    "CommStats",
    "Coords",
    "DeadlockError",
    "Divergence",
    "Fault",
    "FaultPlan",
    "Groups",
    "InjectedFault",
    "Layout",
    "PeerFailedError",
    "RankContext",
    "RankError",
    "RankOrder",
    "ReductionModel",
    "RetryOutcome",
    "Ring",
    "Shuffled",
    "SimulationError",
    "SimulationTimeout",
    "ToleranceError",
    "Tree",
    "UnfiredFaultPlanWarning",
    "UnsupportedOperationError",
    "UnwaitedWorkWarning",
    "check_close",
    "debug",
    "dump",
    "explore",
    "run",
    "run_processes",
    "run_with_retry",
    "tolerance",
]
__version__ = _version.version()  # the installed distribution's metadata (simdist/_version.py)

# Where each public name lives, in the order the package loads them. The package loads them
# (and torch with them) when one of them is first used, not on `import simdist`, so that the
# command line's --version and --help answer without importing torch. The first public name
# used loads them all, as the eager import did; the process-wide patches are registered by the
# modules that running a world imports, whichever way it is reached (tests/fuzz_runner/
# test_cli_fast.py compares the modules each entry point loads).
_SOURCES = {
    name: source
    for source, names in (
        (".debug", ("debug", "dump")),
        (".tolerance", ("tolerance", "ToleranceError", "check_close")),
        ("._run", ("run",)),
        (".comm_stats", ("CommCount", "CommStats")),
        (".context", ("Groups", "RankContext")),
        (
            ".errors",
            (
                "AsyncRaceError",
                "BufferOverlapError",
                "CollectiveMismatchError",
                "DeadlockError",
                "PeerFailedError",
                "RankError",
                "SimulationError",
                "SimulationTimeout",
                "UnsupportedOperationError",
                "UnwaitedWorkWarning",
            ),
        ),
        (".explore", ("Divergence", "explore")),
        (".faults", ("Fault", "FaultPlan", "InjectedFault", "UnfiredFaultPlanWarning")),
        (".launch", ("run_processes",)),
        (".layout", ("Coords", "Layout")),
        (".reduction", ("RankOrder", "ReductionModel", "Ring", "Shuffled", "Tree")),
        (".retry", ("RetryOutcome", "run_with_retry")),
    )
    for name in names
}
_MODULES = ("debug", "tolerance")  # public names that are submodules themselves
# A public name that is also its module's name: the package exports the module's function.
_SHADOWED = tuple(name for name, source in _SOURCES.items() if source == f".{name}" and name not in _MODULES)
_loading = threading.local()
_loaded = False


def _load() -> None:
    """Binds every public name, importing its module (idempotent; concurrent calls are
    left to importlib's own per-module locks)."""
    global _loaded
    if _loaded or getattr(_loading, "active", False):
        return  # (a module being loaded uses a public name: `from simdist import Layout`)
    _loading.active = True
    try:
        for name, source in _SOURCES.items():
            module = importlib.import_module(source, __name__)
            globals()[name] = module if name in _MODULES else getattr(module, name)
        _loaded = True
    finally:
        _loading.active = False


def __getattr__(name: str) -> object:
    # Only the public names load: a probe for anything else (`from .. import stacks` in a
    # submodule, copy's and pickle's dunders) is answered at once, and the import system then
    # imports the submodule it names.
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _load()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        # The import system binds a submodule on its package once it is imported
        # (`import simdist.explore` before any public name was used): where the package
        # exports that module's function of the same name, the function stays bound, as
        # with an eager `from .explore import explore`.
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
