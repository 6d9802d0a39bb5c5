"""Run a rank body on a real gloo/NCCL world: one spawned process per rank.

``run_processes`` is the real-world twin of ``simdist.run``: the body receives
the same ``RankContext`` (same layout groups, built by the same
``build_groups``), so one SPMD body can be run on the simulation and on a real
backend and the results compared.

Why the machinery looks the way it does:

* Processes come from a ``forkserver`` that has imported torch once, so every
  later world forks from a warm interpreter (about 0.1 s for 4 ranks instead of
  seconds of ``import torch`` per rank). Where ``forkserver`` is unavailable,
  ``spawn`` is used.
* Ranks meet through a ``FileStore`` in a private temporary folder: no TCP port
  has to be found free (and stay free) between choosing it and binding it.
* Each rank writes its outcome (result or exception) to its own file before it
  leaves, so a rank that is killed later still leaves its answer behind, and
  nothing depends on a queue's feeder thread outliving a crash.
* The parent only waits on process sentinels with deadlines: it can always kill
  the world, so a wrong program never hangs the caller.

``parent`` is the caller's side (checks, start, wait, collect), ``child`` a
rank process's and what it leaves behind, ``torchrun`` the case where this
process is already one rank.
"""

from .child import RemoteTraceback
from .parent import run_processes
from .torchrun import run_torchrun_rank, under_torchrun

__all__ = [
    "RemoteTraceback",
    "run_processes",
    "run_torchrun_rank",
    "under_torchrun",
]
