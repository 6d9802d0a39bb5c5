"""pytest wiring of the differential target: import paths, the planted simdist bug, profiles.

- ``SIMDIST_MUTANT=<name>`` plants that bug of ``simdist_mutants.py`` in simdist's
  ops for the whole session (an unknown name fails at once, listing the valid
  ones), so a campaign can be run against it in its own process.
- Under the test suite's profiles the properties of this folder run a few
  derandomised examples (each costs a simdist world and a gloo one); a campaign
  worker (``SIMDIST_FUZZ_WORKER=1``) and an explicit ``--hypothesis-profile``
  are left alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck

_HERE = Path(__file__).resolve().parent
# A campaign target is also imported outside the suite's pytest configuration
# (`simdist replay`, campaign workers), so it puts its own imports on the path.
for _folder in (_HERE, _HERE.parent / "support"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import folder_profiles  # noqa: E402
import simdist_mutants  # noqa: E402

FALLBACK_PROFILE = "simdist-diff-regular"
_RELAXED: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}
PROFILES: dict[str, dict[str, Any]] = {
    # The regular suite: a handful of derandomised programs (the same every run).
    FALLBACK_PROFILE: {"max_examples": 8, "derandomize": True, "print_blob": True},
    "simdist-diff-nightly": {"max_examples": 60, "print_blob": True},
}
folder_profiles.register(PROFILES, _RELAXED)

_undo_mutant = simdist_mutants.apply_from_environment()

SUITE_PROFILES = folder_profiles.suite_profiles(FALLBACK_PROFILE, "simdist-diff-nightly")
pytest_make_collect_report = folder_profiles.collect_report_hook(SUITE_PROFILES)


@pytest.fixture(autouse=True, scope="module")
def _warm_gloo_worlds_end_with_the_module() -> Iterator[None]:
    """Warm gloo worlds serve one module's cases, then go: a later test in the
    same worker process (run_processes' own checks) must see no child left."""
    yield
    import diff_worlds

    diff_worlds.close_gloo_worlds()
