"""What one run may reuse from the runs before it, and the one switch for all of it
(docs/internals.md, "Reuse between runs").

Reuse is allowed only where the user's code cannot tell. A run keeps for a
later one only what is listed here, and each user asks at the point where it
would reuse: rank threads (``_core.pool``, ``threads()``) and the world
group's c10d state prepared once per run (``_isolation.c10d_init``,
``enabled()``). ``SIMDIST_REUSE=0`` (or false/no/off) when simdist is
imported turns both off (the nightly profile runs the suite once that way,
so a difference between the two is a bug); ``SIMDIST_REUSE_THREADS=0`` the
parking of rank threads alone.
"""

from __future__ import annotations

import os
import warnings

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
