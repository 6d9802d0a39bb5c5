"""pytest wiring of the fuzz target: import paths, the mutant under test, a fallback profile.

- ``DRAFT_LOSS_MUTANT=<name>`` applies that mutant of ``draft_loss`` (see
  ``mutants.py``) for the whole session, before any property runs; an
  unknown name fails at once and lists the valid ones.
- Under the test suite's profiles (Hypothesis' default, the simdist plugin's
  dev/ci/nightly), the properties of this folder run under smaller ones of
  their own (6 derandomised examples; 40 random ones at nightly), loaded only
  while this folder's modules are imported, so other tests keep theirs. An
  explicit ``--hypothesis-profile`` and a campaign worker
  (``SIMDIST_FUZZ_WORKER=1``) are left alone.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

_HERE = Path(__file__).resolve().parent
# This folder is also a campaign target run outside the suite's pytest config
# (`simdist replay`, campaign workers), so it puts its own imports on the path.
for _folder in (_HERE, _HERE.parent / "support"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import mutants  # noqa: E402

FALLBACK_PROFILE = "simdist-fuzz-regular"
_RELAXED = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
PROFILES = {
    # The regular suite: bounded and derandomised (the same cases every run).
    FALLBACK_PROFILE: {"max_examples": 6, "derandomize": True, "print_blob": True},
    # Under the plugin's nightly profile: more, random cases (long searches are
    # `simdist fuzz`'s job, not the test suite's).
    "simdist-fuzz-nightly": {"max_examples": 40, "print_blob": True},
    # Cases per second of each property (with --hypothesis-show-statistics).
    "simdist-fuzz-speed": {"max_examples": 100},
    # The properties' power by hand: a few hundred random cases, e.g.
    #   DRAFT_LOSS_MUTANT=<name> pytest tests/fuzz --hypothesis-profile=simdist-fuzz-mutants
    "simdist-fuzz-mutants": {"max_examples": 300, "print_blob": True},
}
for _name, _options in PROFILES.items():
    settings.register_profile(_name, **_RELAXED, **_options)

_undo_mutant = mutants.apply_from_environment()


# Each case runs whole simulated worlds (a tenth to a third of a second), so the
# suite-wide profiles' example counts would make these properties dominate the
# test run: under them this folder's modules get their own, smaller profile.
SUITE_PROFILES = {
    "default": FALLBACK_PROFILE,
    "dev": FALLBACK_PROFILE,
    "ci": FALLBACK_PROFILE,
    "nightly": "simdist-fuzz-nightly",
}


def _profile_for_this_folder() -> str | None:
    if os.environ.get("SIMDIST_FUZZ_WORKER") == "1":
        return None  # the campaign worker loads its own profile
    return SUITE_PROFILES.get(settings.get_current_profile_name())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    # A property's settings are fixed when its module is imported (collected):
    # load the fallback around that, and only for this folder's modules.
    profile = _profile_for_this_folder() if isinstance(collector, pytest.Module) else None
    if profile is None:
        yield
        return
    previous = settings.get_current_profile_name()
    settings.load_profile(profile)
    try:
        yield
    finally:
        settings.load_profile(previous)
