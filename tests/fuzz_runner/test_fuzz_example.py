"""The tutorial's example (examples/fuzz_dp_tp, docs/fuzzing.md) end to end, as a user runs it.

From a copy of the example folder: the campaign finds the planted bug and
writes its case into the example's own corpus; replay fails under the bug and
passes without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fuzz_dp_tp"


def simdist(*args: str, cwd: Path, bug: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "MYMODEL_BUG": "1" if bug else "0"}
    return subprocess.run(
        [sys.executable, "-m", "simdist", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_campaign_finds_the_planted_bug_and_replay_tells_fixed_from_broken(tmp_path):
    project = tmp_path / "fuzz_dp_tp"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("regressions", ".simdist", "__pycache__"))
    found = simdist(
        "fuzz", "--budget", "20", "--seed", "1", "-x", "--database", "none", cwd=project, bug=True
    )
    assert found.returncode == 1, found.stdout + found.stderr
    [case_file] = (project / "regressions").glob("*.json")
    case = json.loads(case_file.read_text())
    assert case["target"] == "test_mymodel_fuzz.py::test_parallel_step_matches_one_process"
    assert case["case"]["dp"] >= 2, "the planted bug needs more than one DP rank"
    assert "cases go to regressions" in found.stderr
    broken = simdist("replay", "regressions", cwd=project, bug=True)
    assert broken.returncode == 1 and "1 still fail" in broken.stdout, broken.stdout + broken.stderr
    fixed = simdist("replay", "regressions", cwd=project, bug=False)
    assert fixed.returncode == 0 and "1 pass, 0 still fail" in fixed.stdout, fixed.stdout + fixed.stderr
