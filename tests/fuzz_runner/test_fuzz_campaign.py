"""``simdist fuzz`` / ``simdist replay`` end to end, on small targets with known answers.

The targets live in tests/fuzz_targets/ (not collected by the normal run). Each
campaign runs as its own process, as users run it, with a short budget.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = "tests/fuzz_targets/toy_properties.py"
BUGGY = f"{TOY}::test_buggy_sum_matches_builtin"
CLEAN = f"{TOY}::test_sorted_is_ordered"


def cli_in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    """``simdist ARGS`` run in this process from the checkout's root: (exit code, stdout,
    stderr). For commands that stop before any campaign starts (usage errors, unusable
    files), where a process of their own would only import torch again."""
    from simdist.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the current directory on it
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def simdist_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240.0
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simdist.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def fuzz(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    proc = simdist_cli("fuzz", "--report", str(report), *args, env=env)
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc, data


def test_a_planted_bug_is_found_shrunk_written_and_replayed(tmp_path):
    corpus = tmp_path / "corpus"
    junit = tmp_path / "junit.xml"
    proc, report = fuzz(
        tmp_path,
        "--budget",
        "20",
        "--seed",
        "3",
        "-x",
        "--database",
        "none",
        "--corpus",
        str(corpus),
        "--junit",
        str(junit),
        "--max-world-size",
        "4",
        BUGGY,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [failure] = report["failures"]
    assert failure["property"] == BUGGY
    assert failure["error_type"] == "AssertionError"
    # buggy_sum drops the 4th element: the minimal counterexample is three zeros and a one.
    assert failure["case"] == {"values": [0, 0, 0, 1]}
    assert 'shrunk case: {"values": [0, 0, 0, 1]}' in proc.stderr
    [written] = corpus.glob("*.json")
    case = json.loads(written.read_text())
    assert case["target"] == BUGGY and case["case"] == {"values": [0, 0, 0, 1]}
    assert case["error"]["type"] == "AssertionError" and case["found"]["campaign_seed"] == 3
    # The variables that selected the failure are recorded (not on main); the campaign's plumbing is not.
    assert case["environment"]["SIMDIST_FUZZ_MAX_WORLD_SIZE"] == "4", case.get("environment")
    assert case["environment"]["SIMDIST_FUZZ_CASE_TIMEOUT"] == "300.0"
    assert not {"SIMDIST_FUZZ_INDEX", "SIMDIST_FUZZ_RUN_DIR", "SIMDIST_FUZZ_SEED"} & set(case["environment"])
    # The output policy, printed (not on main): cases, database and logs, each where it went.
    assert f"cases go to {corpus}" in proc.stderr and "  database    none (--database none)" in proc.stderr
    assert "  logs        .simdist/fuzz-runs/" in proc.stderr, proc.stderr
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "1"

    still = simdist_cli("replay", str(written))
    assert still.returncode == 1 and "FAILS" in still.stdout and "buggy_sum(0, 0, 0, 1)" in still.stdout
    fixed = simdist_cli("replay", str(corpus), env={"TOY_FIXED": "1"})
    assert fixed.returncode == 0 and "1 pass, 0 still fail" in fixed.stdout


def test_a_clean_target_exits_0_with_coverage_and_progress(tmp_path):
    proc, report = fuzz(tmp_path, "--budget", "3", "--seed", "1", "--database", "none", "--no-corpus", CLEAN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["failures"] == [] and report["exit_code"] == 0
    assert report["properties"] == [CLEAN]
    assert report["cases_by_property"][CLEAN] == report["cases"] > 0
    assert set(report["coverage"]["length"]) <= {str(n) for n in range(9)}
    assert "failures: none" in proc.stderr and "coverage (cases per value)" in proc.stderr
    assert "fuzz " in proc.stderr and "cases " in proc.stderr  # the progress line


def test_workers_share_the_example_database_so_a_known_failure_replays_first(tmp_path):
    db = tmp_path / "db"
    # Both properties: a worker that starts after its peer found the bug still has one to fuzz.
    first, report1 = fuzz(
        tmp_path,
        "--budget",
        "3",
        "--seed",
        "5",
        "--workers",
        "2",
        "--database",
        str(db),
        "--no-corpus",
        BUGGY,
        CLEAN,
    )
    assert first.returncode == 1, first.stderr
    assert len(report1["failures"]) == 1 and report1["failures"][0]["case"] == {"values": [0, 0, 0, 1]}
    assert set(report1["cases_by_worker"]) == {"0", "1"}, "both workers fuzzed"
    assert any(db.rglob("*")), "the failure was not saved to the shared database"
    second, report2 = fuzz(
        tmp_path, "--budget", "20", "--seed", "6", "-x", "--database", str(db), "--no-corpus", BUGGY
    )
    assert second.returncode == 1
    # A fresh seed, but the database hands the saved failure back before any search.
    assert report2["failures"][0]["cases_before_first_failure"] == 0
    assert report2["failures"][0]["case"] == report1["failures"][0]["case"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "0", CLEAN], "--budget"),
        (["--budget", "1", "tests/fuzz_targets/missing.py"], "does not exist"),
        (["--budget", "1", "--workers", "0", CLEAN], "--workers"),
        (["--budget", "1", "--database", "python:nowhere_module:db", CLEAN], "cannot load"),
        (["--budget", "1", "--database", "python:json:dumps", CLEAN], "calling json.dumps() to make"),
        (["--budget", "1", "--report", "no/such/dir/r.json", CLEAN], "does not exist"),
    ],
)
def test_usage_errors_exit_2_with_a_clear_message(capsys, monkeypatch, args, message):
    code, out, err = cli_in_process(capsys, monkeypatch, "fuzz", "--no-corpus", *args)
    assert code == 2, out + err
    assert message in err


def test_a_database_factory_that_raises_is_a_usage_error_naming_the_option(capsys, monkeypatch):
    import types

    def database() -> None:
        raise KeyError("FUZZ_REDIS_HOST")

    monkeypatch.setitem(sys.modules, "ci_fuzzdb", types.SimpleNamespace(database=database))
    code, out, err = cli_in_process(
        capsys,
        monkeypatch,
        "fuzz",
        "--no-corpus",
        "--budget",
        "1",
        "--database",
        "python:ci_fuzzdb:database",
        CLEAN,
    )
    assert code == 2, out + err
    assert "--database 'python:ci_fuzzdb:database'" in err and "KeyError: 'FUZZ_REDIS_HOST'" in err
    assert "Traceback" not in out + err


@pytest.mark.parametrize(
    "target, message",
    [
        ("tests/fuzz_targets/no_properties.py", "no Hypothesis property"),
        ("tests/fuzz_targets/broken_import.py", "could not collect the target"),
    ],
)
def test_targets_that_cannot_be_fuzzed_are_target_errors(tmp_path, target, message):
    proc, report = fuzz(tmp_path, "--budget", "2", "--database", "none", "--no-corpus", target)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert report["problems"] and "crash" not in " ".join(report["problems"])


def test_a_dying_worker_is_a_crash_not_a_property_failure(tmp_path):
    proc, report = fuzz(
        tmp_path, "--budget", "2", "--database", "none", "--no-corpus", "tests/fuzz_targets/dying_worker.py"
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert report["failures"] == []
    assert any(p.startswith("crash: worker 0 died") for p in report["problems"])


def _start_campaign(report: Path) -> tuple[subprocess.Popen, Path]:
    """A 300 s two-worker campaign of a clean target, once both workers fuzz."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simdist.cli",
            "fuzz",
            "--budget",
            "300",
            "--workers",
            "2",
            "--database",
            "none",
            "--no-corpus",
            "--report",
            str(report),
            CLEAN,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Wait until the workers have started fuzzing (their event files grow).
    deadline = time.monotonic() + 120
    runs = ROOT / ".simdist" / "fuzz-runs"
    while time.monotonic() < deadline:
        logs = (
            [p for p in runs.glob(f"*-{proc.pid}/worker-*.jsonl") if p.stat().st_size > 0]
            if runs.exists()
            else []
        )
        if len(logs) == 2:
            return proc, logs[0].parent
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the workers never started")


def _worker_pids(run_dir: Path) -> list[int]:
    pids = [
        json.loads(line)["pid"]
        for p in run_dir.glob("worker-*.jsonl")
        for line in p.read_text().splitlines()
        if '"e": "start"' in line
    ]
    assert len(pids) == 2
    return pids


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for whoever reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


@pytest.mark.parametrize(("sig", "how"), [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_ctrl_c_or_sigterm_stops_every_worker_and_still_prints_the_summary(tmp_path, sig, how):
    # SIGTERM is what a CI runner sends a cancelled job: it ended the campaign
    # process alone, with no summary, and its workers searched on, unseen.
    report = tmp_path / "report.json"
    proc, run_dir = _start_campaign(report)
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert f"interrupted ({how})" in err and "cases" in err
    data = json.loads(report.read_text())
    assert data["exit_code"] == 130
    # Every worker's event stream ends: they were stopped, not left running.
    for pid in _worker_pids(run_dir):
        assert not _running(pid), pid


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers ask Linux for a parent-death signal"
)
def test_workers_end_when_the_campaign_process_is_killed(tmp_path):
    # SIGKILL (an out-of-memory kill) runs no stop path in the campaign: the
    # workers end on their own when it is gone, instead of searching on.
    proc, run_dir = _start_campaign(tmp_path / "report.json")
    pids = _worker_pids(run_dir)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 60  # a bound against hanging the suite, not a timing claim
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in pids if _running(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} went on after the campaign process was killed"


def test_a_failure_still_shrinking_when_time_is_up_is_reported_unshrunk(tmp_path):
    target = "tests/fuzz_targets/slow_shrink.py"
    # The grace period must outlast a worker's start-up on a loaded machine
    # (else it is killed before its first case), yet stop the long shrink.
    proc, report = fuzz(
        tmp_path,
        "--budget",
        "1",
        "--grace",
        "10",
        "--seed",
        "2",
        "--database",
        "none",
        "--corpus",
        str(tmp_path / "corpus"),
        target,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [failure] = report["failures"]
    assert failure["shrunk"] is False and failure["error_type"] == "AssertionError"
    assert sum(failure["case"]["values"]) > 0  # a real failing case, written and replayable
    assert "stopped before shrinking finished" in proc.stderr
    assert len(list((tmp_path / "corpus").glob("*.json"))) == 1


def test_without_the_test_extras_the_commands_say_what_to_install():
    code = (
        "import sys; sys.modules['hypothesis'] = None; from simdist.cli import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    for command in (["fuzz", "--budget", "1"], ["replay", "x.json"]):
        proc = subprocess.run(
            [sys.executable, "-c", code, *command], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2, proc.stderr
        assert "needs Hypothesis and pytest" in proc.stderr and "'torch-simdist[test]'" in proc.stderr


def test_replay_rejects_unusable_files(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, out, _ = cli_in_process(capsys, monkeypatch, "replay", str(bad))
    assert code == 2 and "not a readable JSON case file" in out
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({"format": "simdist-fuzz-case/1", "target": "tests/nowhere.py::test_x", "case": {}})
    )
    code, out, _ = cli_in_process(capsys, monkeypatch, "replay", str(other))
    assert code == 2 and "not found" in out
    # A hand-edited path to a file that is not Python names the field, once.
    real = json.loads(next((ROOT / "fixtures" / "regressions").glob("test_split_*.json")).read_text())
    for field, value in (("file", "../../etc/passwd"), ("target", "../../etc/passwd::test_x")):
        edited = tmp_path / f"edited-{field}.json"
        edited.write_text(json.dumps({**real, field: value}))
        code, out, _ = cli_in_process(capsys, monkeypatch, "replay", str(edited))
        assert code == 2 and f"field '{field}'" in out and "passwd" in out, out
        assert "ModuleNotFoundError" not in out and out.count(str(edited)) == 1


DOWN_DATABASE = '''
from hypothesis.database import ExampleDatabase


class Down(ExampleDatabase):
    """A shared database whose server is not there."""

    def _refused(self, *args):
        raise ConnectionError("Connection refused: the shared example database is down")

    save = fetch = delete = move = _refused


def database():
    return Down()
'''


def test_a_database_that_fails_is_the_environments_error_not_the_propertys(tmp_path):
    (tmp_path / "down_db.py").write_text(DOWN_DATABASE)
    proc, report = fuzz(
        tmp_path,
        *("--budget", "5", "--workers", "2", "--seed", "2", "--no-corpus"),
        *("--database", "python:down_db:database", CLEAN),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert report["failures"] == []
    problems = [p for p in report["problems"] if p.startswith("environment error")]
    assert problems and all("ConnectionError: Connection refused" in p for p in problems)
    assert "example database" in problems[0] and "not the property's failure" in problems[0]
    assert "environment error" in proc.stderr
