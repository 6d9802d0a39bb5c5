"""Every case in fixtures/regressions/ replays and passes: a fixed bug stays fixed.

Cases are written by ``simdist fuzz`` when a property fails. A case that was
found against a deliberately broken draft_loss (a mutant from
tests/fuzz/mutants.py, recorded as ``found.mutant``) must also still fail
under that mutant (applied in-process), which proves the replay really
exercises the bug.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simdist.fuzz import CaseFileError, read_case, replay_case

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((ROOT / "fixtures" / "regressions").glob("*.json"))


def test_the_corpus_is_not_empty():
    assert CASES, "fixtures/regressions/ holds no case: the replay tests below would check nothing"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_passes_on_the_real_code(path):
    replay_case(path, root=ROOT)


MUTANT_CASES = [p for p in CASES if read_case(p).found.get("mutant")]


@pytest.mark.parametrize("path", MUTANT_CASES, ids=[p.stem for p in MUTANT_CASES])
def test_case_still_fails_under_the_mutant_that_it_caught(path):
    if str(ROOT / "tests" / "fuzz") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
    import mutants

    name = read_case(path).found["mutant"]
    undo = mutants.apply(name)
    try:
        with pytest.raises(Exception) as info:
            replay_case(path, root=ROOT)
    finally:
        undo()
    assert not isinstance(info.value, CaseFileError), (
        f"mutant {name}: the case could not be replayed: {info.value}"
    )
