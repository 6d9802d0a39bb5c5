"""Hypothesis profiles of a campaign-target folder (tests/fuzz, tests/differential).

Each case of such a folder runs whole simulated worlds, so the suite-wide
profiles' example counts would make its properties dominate the test run:
under those profiles (Hypothesis' default, the simdist plugin's dev/ci/nightly)
the folder's modules get smaller profiles of their own, loaded only while
they are imported (a property's settings are fixed when its module is
collected), so other tests keep theirs. An explicit ``--hypothesis-profile``
and a campaign worker (``SIMDIST_FUZZ_WORKER=1``, which loads its own) are
left alone.

Imported by the folders' conftest.py files, which put tests/support on the
path themselves: a campaign target is also imported outside the suite's pytest
configuration (`simdist replay`, campaign workers).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
from hypothesis import settings


def register(profiles: Mapping[str, Mapping[str, Any]], common: Mapping[str, Any]) -> None:
    """Register each of ``profiles`` with ``common``'s settings added."""
    for name, options in profiles.items():
        settings.register_profile(name, **common, **options)


def suite_profiles(regular: str, nightly: str) -> dict[str, str]:
    """The folder's profile under each suite-wide one."""
    return {"default": regular, "dev": regular, "ci": regular, "nightly": nightly}


def collect_report_hook(under: Mapping[str, str]) -> Callable[[pytest.Collector], Iterator[None]]:
    """A ``pytest_make_collect_report`` hook wrapper for the folder's conftest:
    its modules are collected under ``under[suite profile]``."""

    def profile_for_this_folder() -> str | None:
        if os.environ.get("SIMDIST_FUZZ_WORKER") == "1":
            return None  # the campaign worker loads its own profile
        return under.get(settings.get_current_profile_name())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
        profile = profile_for_this_folder() if isinstance(collector, pytest.Module) else None
        if profile is None:
            yield
            return
        previous = settings.get_current_profile_name()
        settings.load_profile(profile)
        try:
            yield
        finally:
            settings.load_profile(previous)

    return pytest_make_collect_report
