"""Start-up of a campaign's workers: the target is collected once, by a worker
server, and the workers forked from it run every round; forking never leaves a
worker stuck in OpenMP; the progress line says what the workers are doing while
no case has run yet (issue 19, point 9).

Timings live in benchmarks/fuzz_mutants.py (time to the first case); these
tests check what happens, never how fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simdist.fuzz._stats import CampaignStats
from simdist.fuzz._summary import progress_line

ROOT = Path(__file__).resolve().parents[2]
COUNTED = str(ROOT / "tests" / "fuzz_targets" / "counted_import.py")


def _campaign(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "simdist",
            "fuzz",
            "--database",
            "none",
            "--no-corpus",
            "--report",
            str(report),
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    return proc, (json.loads(report.read_text()) if report.exists() else {})


def test_the_target_is_imported_once_for_all_workers_which_run_every_round(tmp_path):
    imports = tmp_path / "imports.txt"
    proc, data = _campaign(
        tmp_path, "--budget", "3", "--workers", "3", COUNTED, env={"IMPORT_LOG": str(imports)}
    )
    assert proc.returncode == 0, proc.stderr
    # One import (by the server), not one per worker; no worker imported it
    # again for a later round.
    assert len(imports.read_text().splitlines()) == 1, imports.read_text()
    assert sorted(data["ready_after_s"]) == ["0", "1", "2"]
    assert all(data["cases_by_worker"][k] > 0 for k in ("0", "1", "2")), data["cases_by_worker"]
    rounds = sum(data["rounds"].values()) if isinstance(data["rounds"], dict) else data["rounds"]
    # Several rounds a worker (the target's two properties get one each
    # however short the budget), each in the process it started in.
    assert rounds >= 6, data["rounds"]
    pids = set()
    for path in data_run_dir(data).glob("worker-*.jsonl"):
        starts = [json.loads(line) for line in path.read_text().splitlines() if '"e": "start"' in line]
        assert len(starts) == 1
        pids.add(starts[0]["pid"])
    assert len(pids) == 3


def data_run_dir(data: dict) -> Path:
    run_dir = Path(data["run_dir"])
    return run_dir if run_dir.is_absolute() else ROOT / run_dir


def test_without_the_server_every_worker_imports_the_target(tmp_path):
    # SIMDIST_FUZZ_SERVER=0: each worker forked from the campaign, collecting on its own.
    imports = tmp_path / "imports.txt"
    proc, _ = _campaign(
        tmp_path,
        "--budget",
        "1",
        "--workers",
        "2",
        COUNTED,
        env={"IMPORT_LOG": str(imports), "SIMDIST_FUZZ_SERVER": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    assert len(imports.read_text().splitlines()) == 2


# A campaign started from a process that has already used its intra-op thread
# pool (run_campaign called from a test or a notebook): a worker forked from
# it that uses more than one thread would wait forever in its first matmul.
DIRTY_PARENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch

    torch.set_num_threads(2)
    a = torch.randn(1500, 1500)
    (a @ a).sum()  # the pool has run
    from simdist.fuzz import CampaignConfig, run_campaign

    result = run_campaign(
        CampaignConfig(
            targets=[sys.argv[1]], budget=2, workers=2, database=None, corpus=None,
            case_timeout=30, grace=10, runs_dir=Path(sys.argv[2]),
        )
    )
    print("cases", result.stats.cases, "failures", len(result.stats.failures), result.problems)
    sys.exit(result.exit_code)
    """
)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_workers_multiply_matrices_after_the_campaign_process_used_its_thread_pool(tmp_path, threads):
    proc = subprocess.run(
        [sys.executable, "-c", DIRTY_PARENT, COUNTED, str(tmp_path / "runs")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": threads},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "failures 0" in proc.stdout and "cases 0 " not in proc.stdout, proc.stdout


def test_a_collection_error_in_the_server_is_every_workers_target_error(tmp_path):
    proc, data = _campaign(tmp_path, "--budget", "2", "--workers", "2", "tests/fuzz_targets/broken_import.py")
    assert proc.returncode == 2, proc.stderr
    problems = [p for p in data["problems"] if p.startswith("target error")]
    assert len(problems) == 2, data["problems"]
    assert all("a_module_that_does_not_exist" in p for p in problems), problems


def test_the_progress_line_says_what_workers_do_before_the_first_case():
    stats = CampaignStats()
    assert progress_line(stats, 1.0, 60, 2).endswith("(starting: importing and collecting the target)")
    stats.ready_at[0] = 1.5
    assert progress_line(stats, 2.0, 60, 2).endswith("(1/2 worker(s) ready: running the first cases)")
    stats.cases = 1
    assert "ready" not in progress_line(stats, 3.0, 60, 2)


# -- point 15: a single-property campaign and its first failure ----------------------------


def test_a_single_property_campaign_says_why_it_stops_at_its_first_failure(tmp_path):
    buggy = "tests/fuzz_targets/toy_properties.py::test_buggy_sum_matches_builtin"
    proc, data = _campaign(tmp_path, "--budget", "120", "--workers", "2", buggy)
    assert proc.returncode == 1, proc.stderr
    assert len(data["failures"]) == 1  # found once, not once per worker
    # Without -x the workers stop because the only property failed (not the
    # budget), and the summary says so and why.
    assert set(data["stop_reasons"].values()) == {"every property failed"}, data["stop_reasons"]
    assert "stopped     every property failed: a failing property is not fuzzed further" in proc.stderr
    assert "its only property failed, so the campaign ended before its budget" in proc.stderr
    # -x says it stopped at the first failure, and nothing about the only property.
    proc_x, data_x = _campaign(tmp_path, "--budget", "120", "-x", buggy)
    assert proc_x.returncode == 1 and len(data_x["failures"]) == 1, proc_x.stderr
    assert "stopped at the first failure (-x)" in proc_x.stderr
    assert "its only property failed" not in proc_x.stderr
