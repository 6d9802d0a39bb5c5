"""The root conftest's guard: a test that leaves simdist.debug's defaults
changed (trace-on-failure switched on, a ``debug.defaults()`` block left open)
fails, and the tests after it run with the defaults as they were."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

_ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

_LEAKY = """
import os
import simdist
from simdist.debug import _options

def test_switches_trace_on_failure_on():
    os.environ[_options.TRACE_ENV] = "traces"

def test_sees_it_off_again():
    assert os.environ.get(_options.TRACE_ENV) is None
    assert _options.current().trace_dir is None

_KEPT = []  # (a block nobody holds is closed when it is collected)

def test_leaves_a_defaults_block_open():
    block = simdist.debug.defaults(post_mortem=True)
    block.__enter__()
    _KEPT.append(block)

def test_sees_no_block_open():
    assert _options.current().post_mortem is False

def test_closes_what_it_opens():
    with simdist.debug.defaults(post_mortem=True):
        assert _options.current().post_mortem
"""


def test_a_test_leaving_debug_defaults_changed_fails_and_the_next_sees_them_restored(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SIMDIST_TRACE_ON_FAILURE", raising=False)
    pytester.makeconftest(_ROOT_CONFTEST.read_text())
    pytester.makepyfile(test_leaky=_LEAKY)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_switches_trace_on_failure_on*",
            "*SIMDIST_TRACE_ON_FAILURE='traces' (was None)*",
            "*ERROR at teardown of test_leaves_a_defaults_block_open*",
            "*SIMDIST_TRACE_ON_FAILURE=None (was None), * open defaults() block(s)*",
        ]
    )
