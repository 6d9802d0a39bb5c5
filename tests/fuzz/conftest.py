"""pytest wiring of the fuzz target: import paths, the mutant under test, a fallback profile.

- ``DRAFT_LOSS_MUTANT=<name>`` applies that mutant of ``draft_loss`` (see
  ``mutants.py``) for the whole session, before any property runs; an
  unknown name fails at once and lists the valid ones.
- Without a Hypothesis profile chosen by anyone else (``--hypothesis-profile``,
  the simdist plugin, a campaign worker with ``SIMDIST_FUZZ_WORKER=1``), the
  properties of this folder run under a bounded, derandomised profile that
  keeps the regular test suite short. It is loaded only while this folder's
  modules are imported, so other tests keep their own defaults.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, settings

_HERE = Path(__file__).resolve().parent
for _folder in (_HERE, _HERE.parent):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import mutants  # noqa: E402

FALLBACK_PROFILE = "simdist-fuzz-regular"
_RELAXED = {"deadline": None, "database": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
PROFILES = {
    # The regular suite: bounded and derandomised (the same cases every run).
    FALLBACK_PROFILE: {"max_examples": 6, "derandomize": True, "print_blob": True},
    # Cases per second of each property (with --hypothesis-show-statistics).
    "simdist-fuzz-speed": {"max_examples": 100},
    # The properties' power by hand: a few hundred random cases, e.g.
    #   DRAFT_LOSS_MUTANT=<name> pytest tests/fuzz --hypothesis-profile=simdist-fuzz-mutants
    "simdist-fuzz-mutants": {"max_examples": 300, "print_blob": True},
}
for _name, _options in PROFILES.items():
    settings.register_profile(_name, **_RELAXED, **_options)

_undo_mutant = mutants.apply_from_environment()


def _wants_fallback() -> bool:
    if os.environ.get("SIMDIST_FUZZ_WORKER") == "1":
        return False  # the campaign worker loads its own profile
    return settings.get_current_profile_name() == "default"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    # A property's settings are fixed when its module is imported (collected):
    # load the fallback around that, and only for this folder's modules.
    if not (isinstance(collector, pytest.Module) and _wants_fallback()):
        yield
        return
    settings.load_profile(FALLBACK_PROFILE)
    try:
        yield
    finally:
        settings.load_profile("default")
