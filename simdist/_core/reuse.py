"""What one run may reuse from the runs before it, and the one switch for all of it.

Reuse is allowed only where the user's code cannot tell: every run observes a
fresh world (its own process groups and group names, c10d state that holds
nothing of an earlier run, a fresh store, the caller's generator and process
state as documented). Everything a run keeps for a later one is listed here,
and each user of it asks ``enabled()`` at the point where it would reuse:

* rank threads (``_core.pool``): a rank thread that ended its run cleanly is
  parked and runs a rank of the next run, put back as a new thread would be
  (its thread-locals, context, name and torch's thread state checked);
* the world group's c10d state (``_isolation.c10d_init``): each rank's
  default group is made by c10d's own group constructor from arguments
  prepared once per run, instead of ``init_process_group``'s whole path per
  rank (whose world rank map alone is O(world) per rank).

Process-wide patches are not reuse: they are counted per run in progress and
removed once the last run ends, whatever this switch says.

``SIMDIST_REUSE=0`` in the environment when simdist is imported turns every
one of them off (the nightly profile runs the suite once that way, so a
difference between the two is a bug). ``SIMDIST_REUSE_THREADS=0`` turns off
the parking of rank threads alone.
"""

from __future__ import annotations

import os

__all__ = ["ENABLED", "THREADS", "enabled", "threads"]


def _off(name: str) -> bool:
    return os.environ.get(name, "1").strip() == "0"


# Module attributes, so a test can turn reuse off in-process (monkeypatch).
ENABLED = not _off("SIMDIST_REUSE")
THREADS = ENABLED and not _off("SIMDIST_REUSE_THREADS")


def enabled() -> bool:
    """Whether a run may reuse what an earlier run left (threads, the prepared c10d init)."""
    return ENABLED


def threads() -> bool:
    """Whether a rank thread that ended its run cleanly may be parked for the next one."""
    return ENABLED and THREADS
