"""Every case in fixtures/regressions/ replays and passes: a fixed bug stays fixed.

Cases are written by ``simdist fuzz`` when a property fails. A case that was
found against a deliberately broken draft_loss (a mutant from
tests/fuzz/mutants.py, recorded as ``found.mutant``) must also still fail
under that mutant, which proves the replay really exercises the bug.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simdist.fuzz import read_case, replay_case

ROOT = Path(__file__).resolve().parents[1]
CASES = sorted((ROOT / "fixtures" / "regressions").glob("*.json"))


def test_the_corpus_is_not_empty():
    assert CASES, "fixtures/regressions/ holds no case: the replay tests below would check nothing"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_passes_on_the_real_code(path):
    replay_case(path, root=ROOT)


MUTANT_CASES = [p for p in CASES if read_case(p).found.get("mutant")]


@pytest.mark.parametrize("path", MUTANT_CASES, ids=[p.stem for p in MUTANT_CASES])
def test_case_still_fails_under_the_mutant_that_it_caught(path):
    mutant = read_case(path).found["mutant"]
    proc = subprocess.run(
        [sys.executable, "-m", "simdist.cli", "replay", str(path)], cwd=ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "DRAFT_LOSS_MUTANT": mutant},
    )
    assert proc.returncode == 1, f"mutant {mutant}: the case no longer fails\n{proc.stdout}\n{proc.stderr}"
