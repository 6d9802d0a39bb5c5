"""``simdist fuzz`` on a user's own target: outside the checkout, from anywhere,
with hangs, slow imports, bad output paths and damaged case files.

Each campaign runs as its own process, as users run it (``python -m simdist``,
or the console script where that is the point), with a budget of a second or
two: these tests check what the campaign reports, not how much it finds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simdist.fuzz import CaseFileError, read_case
from simdist.fuzz._project import default_corpus, project_root

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests" / "fuzz_targets"
CONSOLE_SCRIPT = Path(sys.executable).with_name("simdist")


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240.0, script: bool = False
):
    command = [str(CONSOLE_SCRIPT)] if script else [sys.executable, "-m", "simdist"]
    return subprocess.run(
        [*command, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def user_project(tmp_path: Path, *, pyproject: str | None = None) -> Path:
    """A user's project outside the checkout: the toy properties under another name."""
    project = tmp_path / "user_project"
    (project / "props").mkdir(parents=True)
    shutil.copy(TARGETS / "toy_properties.py", project / "props" / "target_user_sum.py")
    if pyproject is not None:
        (project / "pyproject.toml").write_text(pyproject)
    return project


# -- 1, 2: where cases go and how replay finds them ------------------------------------------


def test_a_users_case_replays_from_anywhere_whatever_the_corpus(tmp_path):
    # The user's project has its own settings; the campaign runs from an unrelated
    # directory and writes its cases to a third place (neither holds the property).
    project = user_project(tmp_path, pyproject='[tool.simdist]\ncorpus = "regressions/fuzz"\n')
    target = f"{project / 'props' / 'target_user_sum.py'}::test_buggy_sum_matches_builtin"
    elsewhere, shared = tmp_path / "elsewhere", tmp_path / "shared" / "cases"
    elsewhere.mkdir()
    proc = run_cli(
        "fuzz",
        "--budget",
        "10",
        "--seed",
        "3",
        "-x",
        "--database",
        "none",
        "--corpus",
        str(shared),
        target,
        cwd=elsewhere,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [written] = shared.glob("*.json")
    assert f"cases go to {shared}" in proc.stderr
    # The file names the property relative to itself: no machine's absolute path.
    data = json.loads(written.read_text())
    assert data["target"] == "props/target_user_sum.py::test_buggy_sum_matches_builtin"
    assert data["file"] == "../../user_project/props/target_user_sum.py"
    # Replayed from a third directory: the command the campaign printed works.
    third = tmp_path / "third"
    third.mkdir()
    assert f"replay: simdist replay {written}" in proc.stderr
    still = run_cli("replay", str(written), cwd=third)
    assert still.returncode == 1 and "FAILS" in still.stdout, still.stdout + still.stderr
    fixed = run_cli("replay", str(shared), cwd=third, env={"TOY_FIXED": "1"})
    assert fixed.returncode == 0 and "1 pass, 0 still fail" in fixed.stdout, fixed.stdout


def test_the_default_corpus_follows_the_targets_rootdir(tmp_path, monkeypatch):
    bare = user_project(tmp_path)
    target = str(bare / "props" / "target_user_sum.py")
    # No configuration file at or above the target: the current directory, never
    # the source folder (on main, cases landed beside the property file).
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert project_root([target]) == here.resolve()
    assert default_corpus([target]) == here.resolve() / "fuzz-cases"
    monkeypatch.chdir(ROOT)
    (bare / "pyproject.toml").write_text("[tool.other]\n")  # a project without simdist settings
    assert default_corpus([target]) == bare / "fuzz-cases"
    (bare / "pyproject.toml").write_text('[tool.simdist]\ncorpus = "cases"\n')
    assert default_corpus([f"{target}::test_sorted_is_ordered"]) == bare / "cases"
    # This project's own targets keep their corpus.
    assert default_corpus(["tests/fuzz"]) == ROOT / "fixtures" / "regressions"


def test_a_foreign_case_in_the_projects_corpus_is_skipped_not_an_error(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "fuzz_runner"))
    try:
        from test_regressions import is_foreign
    finally:
        sys.path.remove(str(ROOT / "tests" / "fuzz_runner"))
    foreign = tmp_path / "foreign.json"
    foreign.write_text(
        json.dumps(
            {
                "format": "simdist-fuzz-case/1",
                "target": "target_upstream_step_state.py::test_x",
                "case": {},
            }
        )
    )
    assert is_foreign(read_case(foreign), ROOT)
    own = sorted((ROOT / "fixtures" / "regressions").glob("*.json"))
    assert own and not any(is_foreign(read_case(p), ROOT) for p in own)


# -- 3: a hanging property, a leaking one -----------------------------------------------------


def test_a_hanging_case_is_a_failure_with_its_case_and_a_leak_and_an_unfired_plan_are_named(tmp_path):
    report = tmp_path / "r.json"
    proc = run_cli(
        "fuzz",
        "--budget",
        "2",
        "--case-timeout",
        "2",
        "--database",
        "none",
        "--corpus",
        str(tmp_path / "cases"),
        "--report",
        str(report),
        str(TARGETS / "hangs_and_leaks.py"),
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    [failure] = data["failures"]
    assert failure["property"].endswith("::test_hangs") and failure["error_type"] == "CaseTimeout"
    assert failure["case"] is not None and set(failure["case"]) == {"n"}
    assert "_forever.wait()" in failure["report"], "the stuck stack is shown"
    assert "failures: none" not in proc.stderr
    assert "leaked" in proc.stderr and "leaked-by-case-" in proc.stderr
    # 15: a FaultPlan that matched no call is reported, with its property.
    assert "test_a_crash_is_survived ran a FaultPlan that never fired" in proc.stderr
    assert data["cases_with_unfired_fault_plans"], data["problems"]
    assert len(list((tmp_path / "cases").glob("*.json"))) == 1


def test_a_case_still_running_past_budget_and_grace_is_a_hang_never_clean(tmp_path):
    proc = run_cli(
        "fuzz",
        "--budget",
        "1",
        "--grace",
        "2",
        "--no-corpus",
        "--database",
        "none",
        f"{TARGETS / 'hangs_and_leaks.py'}::test_hangs",
        cwd=ROOT,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "PROBLEM: hang: worker 0 was stuck in a case of" in proc.stderr
    assert "still shrinking" not in proc.stderr


# -- 5: output paths ---------------------------------------------------------------------------


def test_unusable_output_paths_are_refused_before_the_campaign(tmp_path, capsys, monkeypatch):
    from simdist.cli import main
    from simdist.fuzz._campaign import CampaignConfig, UsageError, _validate

    a_file, a_dir = tmp_path / "file.txt", tmp_path / "dir"
    a_file.write_text("x")
    a_dir.mkdir()
    toy = str(TARGETS / "toy_properties.py")
    for option, field, bad in (
        ("--corpus", "corpus", a_file),
        ("--report", "report", a_dir),
        ("--junit", "junit", a_dir),
    ):
        with pytest.raises(UsageError, match=option) as info:
            _validate(CampaignConfig(targets=[toy], **{field: bad}))
        assert bad.name in str(info.value)
    # From the command line: exit 2 before any worker starts (so checked in this process:
    # a process of its own would only import torch again).
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the current directory on it
    code = main(["fuzz", "--budget", "30", "--corpus", str(a_file), toy])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert "--corpus" in err and "is not a directory" in err
    assert "starting" not in err, "refused before any worker started"


def test_an_output_error_after_the_campaign_never_hides_a_failure(tmp_path):
    from simdist.fuzz._campaign import CampaignConfig, ExitCode, _write_cases, _write_reports
    from simdist.fuzz._stats import CampaignStats

    stats = CampaignStats()
    stats.add(0, {"e": "failure", "p": "t.py::test_x", "case": {"v": 1}, "replayable": True, "t": 1.0})
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file where the corpus directory should be created
    cfg = CampaignConfig(targets=["t.py"], corpus=blocked / "sub", report=tmp_path / "gone" / "r.json")
    problems: list[str] = []
    _write_cases(cfg, stats, {}, problems)
    assert problems and problems[0].startswith("output error: could not write the case of t.py::test_x")
    out = tmp_path / "out.txt"
    with out.open("w") as cfg.out:
        code = _write_reports(cfg, stats, ExitCode.FAILED, 1.0, 0, tmp_path, problems)
    assert code == ExitCode.FAILED, "the failure's exit status survives the output error"
    assert "could not write --report" in out.read_text()


# -- 6: damaged case files ---------------------------------------------------------------------


def _case(path: Path, **fields) -> Path:
    data = {
        "format": "simdist-fuzz-case/1",
        "target": "tests/fuzz_targets/toy_properties.py::test_sorted_is_ordered",
    }
    data.update(fields)
    path.write_text(json.dumps(data))
    return path


DAMAGED = {
    "latin1.json": (
        b'{"format": "simdist-fuzz-case/1", "target": "caf\xe9.py::t", "case": {}}',
        "not UTF-8 text (byte 0xe9",
    ),
    "int_target.json": (
        b'{"format": "simdist-fuzz-case/1", "target": 12, "case": {}}',
        "field 'target' must be",
    ),
    "list_case.json": (
        b'{"format": "simdist-fuzz-case/1", "target": "a.py::t", "case": [1]}',
        "field 'case' must be",
    ),
    "int_found.json": (
        b'{"format": "simdist-fuzz-case/1", "target": "a.py::t", "case": {}, "found": 3}',
        "field 'found'",
    ),
}


def test_damaged_case_files_are_unusable_naming_the_file_and_field(tmp_path):
    for name, (content, message) in DAMAGED.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(CaseFileError, match=message.replace("(", r"\(")) as info:
            read_case(tmp_path / name)
        assert name in str(info.value)
    # One replay of them all, after a good case and with one whose case the property cannot decode:
    # each file judged alone (no misattribution to the previous file's target), none "still fails".
    _case(tmp_path / "a_good.json", case={"values": [3, 1, 2]})
    _case(tmp_path / "z_undecodable.json", case={"values": "not a list of ints"})
    proc = run_cli("replay", str(tmp_path), cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("passes") and "a_good.json" in line for line in lines)
    for name, (_, message) in DAMAGED.items():
        [line] = [line for line in lines if name in line]
        assert line.startswith(f"ERROR  {tmp_path / name}") and message in line, line
        assert "test_sorted_is_ordered" not in line, "no misattribution"
    [undecodable] = [line for line in lines if "z_undecodable.json" in line]
    assert undecodable.startswith("ERROR") and "field 'case' cannot be decoded" in undecodable
    assert "6 case(s): 1 pass, 0 still fail, 5 unusable" in proc.stdout


# -- 7: the console script finds the user's modules as python -m does ------------------------


def docs_block_after(marker: str, page: str = "docs/campaigns.md") -> str:
    text = (ROOT / page).read_text()
    start = text.index("```python", text.index(marker)) + len("```python\n")
    return text[start : text.index("```", start)]


def test_the_docs_database_recipe_works_from_the_console_script(tmp_path):
    (tmp_path / "fuzzdb.py").write_text(docs_block_after("<!-- fuzzdb.py -->"))
    proc = run_cli(
        "fuzz",
        "--budget",
        "5",
        "-x",
        "--no-corpus",
        "--database",
        "python:fuzzdb:database",
        f"{TARGETS / 'toy_properties.py'}::test_buggy_sum_matches_builtin",
        cwd=tmp_path,
        script=True,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any((tmp_path / ".simdist" / "fuzz-db").rglob("*")), (
        "the failure was saved in the recipe's database"
    )


# -- 8: a slow import does not eat the budget --------------------------------------------------


def test_a_target_slower_to_import_than_the_budget_still_gets_its_rounds(tmp_path):
    report = tmp_path / "r.json"
    proc = run_cli(
        "fuzz",
        "--budget",
        "1",
        "--grace",
        "10",
        "--no-corpus",
        "--database",
        "none",
        "--report",
        str(report),
        str(TARGETS / "slow_import.py"),
        cwd=ROOT,
        env={"SLOW_IMPORT_SECONDS": "4"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert data["cases"] > 0 and data["ready_after_s"]["0"] >= 4
    assert "worker 0 ready after" in proc.stderr
    too_slow = run_cli(
        "fuzz",
        "--budget",
        "1",
        "--startup",
        "1",
        "--no-corpus",
        "--database",
        "none",
        str(TARGETS / "slow_import.py"),
        cwd=ROOT,
        env={"SLOW_IMPORT_SECONDS": "30"},
    )
    assert too_slow.returncode == 2, too_slow.stderr
    assert "was not ready after 1 s (--startup)" in too_slow.stderr
