"""simdist: run every rank of a DP/PP/TP/CP layout as a thread of one CPU process.

import simdist
results = simdist.run(body, layout=simdist.Layout(tp=2, dp=2, pp=2))
"""

from . import _version, debug, tolerance
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
