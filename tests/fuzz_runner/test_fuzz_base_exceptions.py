"""Every failure of a property becomes a replayable shrunk case, whatever it
raises (issue 28, points 7-8): ``sys.exit()`` in the code under test, and a
``KeyboardInterrupt`` the code raises itself (no Ctrl-C came), which is that
case's failure, while a real SIGINT still stops (see test_ctrl_c_... in
test_fuzz_campaign.py). The targets are in tests/fuzz_targets/base_exceptions.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simdist import fuzz
from simdist.fuzz._property import InterruptInCase, last_failure, telling_interrupts_apart

ROOT = Path(__file__).resolve().parents[2]
TARGETS = "tests/fuzz_targets/base_exceptions.py"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simdist.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )


@pytest.mark.parametrize(
    ("prop", "error_type", "text"),
    [
        ("test_exits_for_long_lists", "SystemExit", "SystemExit(3)"),
        ("test_interrupts_for_long_lists", "KeyboardInterrupt", "KeyboardInterrupt()"),
    ],
)
def test_a_base_exception_in_a_property_is_a_shrunk_replayable_case(
    tmp_path: Path, prop: str, error_type: str, text: str
) -> None:
    report, corpus = tmp_path / "report.json", tmp_path / "corpus"
    target = f"{TARGETS}::{prop}"
    proc = _cli(
        "fuzz", "--budget", "20", "--seed", "3", "-x", "--database", "none",
        "--corpus", str(corpus), "--report", str(report), target,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [failure] = json.loads(report.read_text())["failures"]
    assert failure["property"] == target
    assert failure["case"] == {"values": [0, 0, 0, 0]}  # the only lists that fail: longer than three
    assert failure["error_type"] == error_type
    assert text in failure["error"]
    [written] = corpus.glob("*.json")
    assert json.loads(written.read_text())["error"]["type"] == error_type
    again = _cli("replay", str(written))
    assert again.returncode == 1, again.stdout + again.stderr
    assert "1 still fail" in again.stdout


class _Case(dict):
    def to_json(self) -> dict:
        return dict(self)


@given(case=st.builds(_Case))
@fuzz.replayable(_Case)
def _interrupting(case: _Case) -> None:
    raise KeyboardInterrupt


@given(case=st.builds(_Case))
@fuzz.replayable(_Case)
def _signalled(case: _Case) -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_keyboard_interrupt_the_code_raises_is_the_cases_failure_when_told_apart() -> None:
    with telling_interrupts_apart(), pytest.raises(InterruptInCase):
        _interrupting()
    record = last_failure(_interrupting)
    assert record is not None and record.error_type == "KeyboardInterrupt"


def test_a_sigint_during_a_case_still_stops() -> None:
    with telling_interrupts_apart(), pytest.raises(KeyboardInterrupt):
        _signalled()


def test_outside_a_campaign_a_keyboard_interrupt_stops_as_ctrl_c() -> None:
    # Nothing tells the two apart there: a Ctrl-C must never be taken for a failure.
    with pytest.raises(KeyboardInterrupt):
        _interrupting()
