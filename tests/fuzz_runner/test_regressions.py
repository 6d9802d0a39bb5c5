"""Every case in fixtures/regressions/ replays and passes: a fixed bug stays fixed.

Cases are written by ``simdist fuzz`` when a property fails. A case that was
found against a deliberately broken draft_loss (a mutant from
tests/fuzz/mutants.py, recorded as ``found.mutant``) must also still fail
under that mutant (applied in-process), which proves the replay really
exercises the bug.

A case whose property is not part of this project (a user's campaign on their
own code that wrote into this folder) is skipped with its reason: it cannot
say anything about this project, and must not break its suite.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from simdist.fuzz import CaseFile, CaseFileError, read_case, replay_case

ROOT = Path(__file__).resolve().parents[2]
CASES = sorted((ROOT / "fixtures" / "regressions").glob("*.json"))


def is_foreign(case: CaseFile, root: Path) -> bool:
    """True when the case's property file is not in this project."""
    if case.file is not None:
        located = (case.path.resolve().parent / case.file).resolve()
        if located.is_file():
            return root.resolve() not in located.parents
    return not (root / case.file_part).is_file()


def _read(path: Path) -> CaseFile | None:
    try:
        return read_case(path)
    except CaseFileError:
        return None  # reported by the replay test itself


@pytest.fixture(autouse=True, scope="module")
def _warm_gloo_worlds_end_with_the_module():
    """Replayed differential cases leave the campaign's warm gloo worlds running;
    they go with this module, so a later test in the same worker process
    (run_processes' own checks) sees no child left."""
    yield
    worlds = sys.modules.get("diff_worlds")
    if worlds is not None:
        worlds.close_gloo_worlds()


def test_the_corpus_is_not_empty():
    assert CASES, "fixtures/regressions/ holds no case: the replay tests below would check nothing"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_case_passes_on_the_real_code(path):
    case = _read(path)
    if case is not None and is_foreign(case, ROOT):
        pytest.skip(f"{path.name}: a case of {case.target}, which is not in this project (a foreign case)")
    replay_case(path, root=ROOT)


MUTANT_CASES = [p for p in CASES if (c := _read(p)) is not None and c.found.get("mutant")]


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
