"""pytest plugin (auto-loaded): markers, a `simdist_run` fixture, test profiles.

A thin layer over the library: everything here can be done without pytest.

- ``gpu`` tests are skipped where CUDA is not available.
- ``slow`` tests run only with ``--simdist-profile=nightly`` (or the
  ``SIMDIST_PROFILE=nightly`` environment variable); the default profile keeps CI short.
- ``--simdist-timeout`` bounds every ``simdist_run`` call (the watchdog).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest

PROFILES = ("ci", "nightly")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simdist")
    group.addoption(
        "--simdist-profile", choices=PROFILES, default=os.environ.get("SIMDIST_PROFILE", "ci"),
        help="ci (default): skip tests marked slow; nightly: run everything",
    )
    group.addoption(
        "--simdist-timeout", type=float, default=120.0,
        help="watchdog timeout in seconds for each simdist_run call (default 120)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped where torch.cuda.is_available() is False")
    config.addinivalue_line("markers", "slow: long-running; runs only with --simdist-profile=nightly")
    config.addinivalue_line("markers", "gloo: starts a real gloo world of processes")
    profile = config.getoption("--simdist-profile")
    if profile not in PROFILES:
        raise pytest.UsageError(f"--simdist-profile must be one of {PROFILES}, got {profile!r}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    nightly = config.getoption("--simdist-profile") == "nightly"
    cuda = None
    for item in items:
        if "slow" in item.keywords and not nightly:
            item.add_marker(pytest.mark.skip(reason="slow: run with --simdist-profile=nightly"))
        if "gpu" in item.keywords:
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="gpu: CUDA is not available here"))


@pytest.fixture
def simdist_run(request: pytest.FixtureRequest) -> Callable[..., list[Any]]:
    """``simdist.run`` with the session's watchdog timeout as default."""
    from .world import run

    timeout = request.config.getoption("--simdist-timeout")

    def runner(fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
        kwargs.setdefault("timeout", timeout)
        return run(fn, **kwargs)

    return runner
