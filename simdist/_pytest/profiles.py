"""Test profiles (docs/pytest.md): which tests run and how hard Hypothesis searches.

``ci`` is derandomised (the same examples on every run, so CI never flakes on
a new draw) with no deadline (shared CI machines make timings meaningless).
The example database is left at Hypothesis' default in every profile.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

PROFILES = ("dev", "ci", "nightly")
RUNS_SLOW = {"dev": False, "ci": False, "nightly": True}
FUZZ_WORKER_ENV = "SIMDIST_FUZZ_WORKER"
_SAVED = pytest.StashKey[str]()
_SETTINGS: dict[str, dict[str, Any]] = {
    "dev": {"max_examples": 10, "deadline": None},
    "ci": {"max_examples": 50, "derandomize": True, "deadline": None, "print_blob": True},
    "nightly": {"max_examples": 1000, "deadline": None, "print_blob": True},
}


def load_hypothesis_profile(config: pytest.Config, name: str) -> str | None:
    """Registers the three profiles and loads ``name``; returns what was loaded.

    Leaves Hypothesis alone in a ``simdist fuzz`` worker (which has loaded its
    own profile), when ``--hypothesis-profile`` was given, or when Hypothesis
    is not installed.
    """
    if os.environ.get(FUZZ_WORKER_ENV) == "1":
        return None
    if config.getoption("hypothesis_profile", None) is not None:
        return None
    try:
        from hypothesis import settings
    except ImportError:
        return None
    # Always ours, also over Hypothesis' own built-in "ci" (100 examples, no
    # database): the names mean what this plugin documents.
    # Built on Hypothesis' "default" profile, not on whatever is loaded now
    # (register_profile would otherwise inherit from the current default).
    base = settings.get_profile("default")
    for profile, values in _SETTINGS.items():
        settings.register_profile(profile, parent=base, **values)
    # Remember what was in force: a pytest run inside a process (pytester)
    # must not leave its profile to the tests that run after it.
    saved = f"_simdist_before_{id(config)}"
    settings.register_profile(saved, parent=settings.default)
    config.stash[_SAVED] = saved
    settings.load_profile(name)
    return name


def restore_hypothesis_profile(config: pytest.Config) -> None:
    saved = config.stash.get(_SAVED, None)
    if saved is not None:
        from hypothesis import settings

        settings.load_profile(saved)
