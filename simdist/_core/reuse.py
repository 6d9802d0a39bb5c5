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

``SIMDIST_REUSE=0`` (or false/no/off) in the environment when simdist is imported turns every
one of them off (the nightly profile runs the suite once that way, so a
difference between the two is a bug). ``SIMDIST_REUSE_THREADS=0`` turns off
the parking of rank threads alone.
"""

from __future__ import annotations

import os
import warnings

__all__ = ["ENABLED", "THREADS", "enabled", "threads"]


_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"", "1", "true", "yes", "on"})


def _off(name: str) -> bool:
    """Whether the environment variable ``name`` turns reuse off. A value that
    is neither (a typo) leaves it on, and says so: a user turning reuse off
    to rule it out must not be left measuring it on."""
    value = os.environ.get(name, "1").strip().lower()
    if value in _OFF:
        return True
    if value not in _ON:
        warnings.warn(
            f"{name}={os.environ[name]!r} is not understood (0/false/no/off turn reuse off, "
            f"1/true/yes/on leave it on): reuse stays on",
            RuntimeWarning,
            stacklevel=2,
        )
    return False


# Module attributes, so a test can turn reuse off in-process (monkeypatch).
ENABLED = not _off("SIMDIST_REUSE")
THREADS = ENABLED and not _off("SIMDIST_REUSE_THREADS")


def enabled() -> bool:
    """Whether a run may reuse what an earlier run left (threads, the prepared c10d init)."""
    return ENABLED


def threads() -> bool:
    """Whether a rank thread that ended its run cleanly may be parked for the next one."""
    return ENABLED and THREADS
