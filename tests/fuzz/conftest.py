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

import sys
from pathlib import Path

from hypothesis import HealthCheck

_HERE = Path(__file__).resolve().parent
# This folder is also a campaign target run outside the suite's pytest config
# (`simdist replay`, campaign workers), so it puts its own imports on the path.
for _folder in (_HERE, _HERE.parent / "support"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import folder_profiles  # noqa: E402
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
folder_profiles.register(PROFILES, _RELAXED)

_undo_mutant = mutants.apply_from_environment()

# Each case runs whole simulated worlds (a tenth to a third of a second): under
# the suite-wide profiles this folder's modules get their own, smaller one.
SUITE_PROFILES = folder_profiles.suite_profiles(FALLBACK_PROFILE, "simdist-fuzz-nightly")
pytest_make_collect_report = folder_profiles.collect_report_hook(SUITE_PROFILES)
