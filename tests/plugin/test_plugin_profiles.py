"""--simdist-profile: which tests run and the Hypothesis settings in force (pytester)."""

from __future__ import annotations

import pytest
from hypothesis import settings

pytest_plugins = ["pytester"]

REPORT_SETTINGS = """
import pytest
from hypothesis import settings

@pytest.mark.slow
def test_slow():
    pass

def test_report():
    s = settings.default
    print(f"PROFILE max_examples={s.max_examples} derandomize={s.derandomize} deadline={s.deadline}")
"""


def profile_line(pytester: pytest.Pytester, *args: str) -> tuple[str, pytest.RunResult]:
    pytester.makepyfile(REPORT_SETTINGS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-s", *args)
    lines = [line for line in result.outlines if "PROFILE " in line]
    assert len(lines) == 1, result.outlines
    return lines[0].split("PROFILE ", 1)[1], result


@pytest.mark.parametrize(
    ("args", "expected", "slow_runs"),
    [
        ((), "max_examples=50 derandomize=True deadline=None", False),  # ci is the default
        (("--simdist-profile=ci",), "max_examples=50 derandomize=True deadline=None", False),
        (("--simdist-profile=dev",), "max_examples=10 derandomize=False deadline=None", False),
        (("--simdist-profile=nightly",), "max_examples=1000 derandomize=False deadline=None", True),
    ],
)
def test_profile_picks_hypothesis_settings_and_slow_tests(
    pytester: pytest.Pytester, args: tuple[str, ...], expected: str, slow_runs: bool
) -> None:
    before = repr(settings.default)
    line, result = profile_line(pytester, *args)
    assert line == expected
    result.assert_outcomes(passed=1 + slow_runs, skipped=1 - slow_runs)
    # A run inside this process leaves this session's settings as they were.
    assert repr(settings.default) == before


def test_environment_variable_picks_the_profile(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SIMDIST_PROFILE", "nightly")
    line, _ = profile_line(pytester)
    assert line.startswith("max_examples=1000 ")


def test_hypothesis_profile_option_wins(pytester: pytest.Pytester) -> None:
    settings.register_profile("simdist-test-explicit", max_examples=7)
    line, _ = profile_line(
        pytester, "--hypothesis-profile=simdist-test-explicit", "--simdist-profile=nightly"
    )
    assert line.startswith("max_examples=7 ")


def test_a_fuzz_worker_keeps_the_profile_it_loaded(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest("""
from hypothesis import settings
settings.register_profile("fuzz-worker", max_examples=3, deadline=None)
settings.load_profile("fuzz-worker")
""")
    monkeypatch.setenv("SIMDIST_FUZZ_WORKER", "1")
    line, _ = profile_line(pytester, "--simdist-profile=nightly")
    assert line.startswith("max_examples=3 ")
    monkeypatch.delenv("SIMDIST_FUZZ_WORKER")
    line, _ = profile_line(pytester, "--simdist-profile=nightly")
    assert line.startswith("max_examples=1000 ")


def test_unknown_profile_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "--simdist-profile=nightlly")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--simdist-profile: invalid choice: 'nightlly' (choose from *dev*ci*nightly*"]
    )
