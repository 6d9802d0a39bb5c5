"""The nightly mutation job (benchmarks/mutation.py, its generator
benchmarks/_mutate.py): mutants are deterministic, each one compiles and
differs from the original, strings, annotations and raise statements are
never touched, ids do not depend on where the tree lies, a seeded sample is
the same sample, and a campaign's exit status and report become the right
verdict. Only the slow test runs a campaign (the nightly profile).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPT = BENCHMARKS / "mutation.py"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mutation_job_{name}", BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


mutate = _load("_mutate")


@pytest.fixture
def mutation(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """benchmarks/mutation.py as a module (it imports its neighbours by bare name)."""
    bare = ("mutation", "_mutate", "_common", "_harness")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in bare:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield importlib.import_module("mutation")
    for name in bare:
        sys.modules.pop(name, None)


# Two files of each kind of code: the loss's maths and the reference model's step.
SOME_FILES = ["draft_loss/cotrain/worker.py", "draft_loss/soft_ce.py"]


def _mutants(root: Path = ROOT, files: list[str] | None = None) -> list:
    return list(mutate.mutants_of_tree(root, files or mutate.package_files(root)))


@pytest.fixture(scope="module")
def every_mutant() -> list:
    """All of draft_loss's mutants, generated once (each one is compiled: about 2 s)."""
    return _mutants()


def _protected_spans(source: str) -> tuple[list[tuple[tuple[int, int], tuple[int, int]]], set[int]]:
    """Spans of string tokens, f-strings and annotations; lines of raise statements."""
    spans = [
        (tok.start, tok.end)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1)
    ]
    raise_lines: set[int] = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        annotations: list[ast.AST | None] = []
        if isinstance(node, ast.arg):
            annotations = [node.annotation]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            annotations = [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        elif isinstance(node, ast.JoinedStr):
            annotations = [node]
        elif isinstance(node, ast.Raise):
            raise_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        for a in annotations:
            if a is not None:
                spans.append(((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)))
    return spans, raise_lines


def test_the_generator_is_deterministic(every_mutant: list) -> None:
    again = _mutants(files=SOME_FILES)
    assert [(m.id, m.source) for m in again] == [
        (m.id, m.source) for m in every_mutant if m.path in SOME_FILES
    ]
    assert len(again) > 100


def test_every_mutant_differs_from_the_original_and_compiles(every_mutant: list) -> None:
    originals: dict[str, str] = {}
    for m in every_mutant:
        original = originals.setdefault(m.path, (ROOT / m.path).read_text(encoding="utf-8"))
        assert m.source != original, m.id
        compile(m.source, m.path, "exec", dont_inherit=True)
        # Line numbers stay those of the original: tracebacks and the reach pass agree.
        assert m.source.count("\n") == original.count("\n"), m.id


def test_ids_are_unique_and_in_file_line_column_operator_order(every_mutant: list) -> None:
    mutants = every_mutant
    ids = [m.id for m in mutants]
    assert len(set(ids)) == len(ids)
    files = mutate.package_files(ROOT)
    keys = [(files.index(m.path), m.line, m.col, m.operator) for m in mutants]
    assert keys == sorted(keys)


def test_ids_do_not_depend_on_where_the_tree_lies(tmp_path: Path, every_mutant: list) -> None:
    for path in SOME_FILES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    moved = [m.id for m in _mutants(tmp_path, SOME_FILES)]
    assert moved == [m.id for m in every_mutant if m.path in SOME_FILES]


def test_one_file_alone_gives_the_same_mutants_as_in_the_whole_tree(every_mutant: list) -> None:
    path = "draft_loss/stats.py"
    alone = mutate.mutants_of_source((ROOT / path).read_text(encoding="utf-8"), path)
    assert [m.id for m in alone] == [m.id for m in every_mutant if m.path == path]


def test_strings_annotations_and_raise_statements_are_never_mutated(every_mutant: list) -> None:
    by_file: dict[str, list] = {}
    for m in every_mutant:
        by_file.setdefault(m.path, []).append(m)
    for path, mutants in by_file.items():
        spans, raise_lines = _protected_spans((ROOT / path).read_text(encoding="utf-8"))
        for m in mutants:
            assert m.line not in raise_lines, m.id
            if m.operator.startswith("drop-"):
                continue  # the whole statement goes, its string arguments with it
            for edit in m.edits:
                assert not any(edit.start < end and start < edit.end for start, end in spans), m.id


SAMPLE = '''\
"""Docstring: a + b < c and not d, min(1, 2)."""
import torch


def f(x: int = 1, y: "list[int] | None" = None) -> dict[str, int]:
    """Another docstring: x * 2 - 1."""
    total = x + 2 * y - 3 / x
    total += 1
    if x < 0 or not y:
        raise ValueError(f"bad x {x + 1} < {y * 2}")
    assert x >= 0, f"x {x - 1}"
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.MAX)
    message = "a" + str(x)
    return {"a": min(x, 3), "b": torch.where(x > 0, x, -x), "c": y is None}
'''


def test_each_operator_where_it_applies_and_nowhere_else() -> None:
    mutants = mutate.mutants_of_source(SAMPLE, "pkg/sample.py")
    operators = {m.operator for m in mutants}
    assert operators == {
        "add-sub", "sub-add", "mul-div", "div-mul", "lt-le", "ge-gt", "gt-ge", "is-isnot",
        "or-and", "not-drop", "int-inc", "int-1to0", "min-max", "where-swap",
        "reduceop-max-min", "drop-augassign", "drop-call",
    }  # fmt: skip
    lines = {m.line for m in mutants}
    assert not lines & {1, 2, 6, 10}  # docstrings, the import, the raise with its message
    assert all(m.line != 5 or m.operator == "int-inc" or m.operator == "int-1to0" for m in mutants)
    assert {m.description for m in mutants if m.line == 5} == {
        "1 -> 2",
        "1 -> 0",
    }  # the default, not the annotations
    assert not [m for m in mutants if m.line == 13]  # string building is a message
    assert all(m.error_path for m in mutants if m.line in (9, 11))  # the test of an if that raises, an assert
    assert not any(m.error_path for m in mutants if m.line in (7, 8, 12, 14))
    where = next(m for m in mutants if m.operator == "where-swap")
    assert "torch.where(x > 0, -x, x)" in where.source


def test_a_change_that_cannot_alter_a_value_is_tagged_with_its_rule() -> None:
    mutants = mutate.mutants_of_source("def f(x):\n    return x * 1 + x - 0 + x * 2\n", "pkg/m.py")
    tagged = {m.id: m.equivalent for m in mutants if m.equivalent}
    assert tagged == {"m:2:16:mul-div": "identity-operand", "m:2:24:sub-add": "identity-operand"}
    assert set(tagged.values()) <= set(mutate.EQUIVALENCE_RULES)


def _listed(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--list", *args], capture_output=True, text=True, check=True
    )
    return [line.split()[0] for line in proc.stdout.splitlines()[:-1]]


def test_a_seeded_sample_picks_the_same_ids() -> None:
    files = "--files=draft_loss/soft_ce.py,draft_loss/stats.py"
    first = _listed(files, "--sample", "7", "--seed", "5")
    assert len(first) == 7
    assert _listed(files, "--sample", "7", "--seed", "5") == first
    assert _listed(files, "--sample", "7", "--seed", "6") != first


def test_files_and_ids_select_those_mutants() -> None:
    stats = _listed("--files", "draft_loss/stats.py")
    assert stats and all(i.startswith("stats:") for i in stats)
    assert _listed("--files", "draft_loss/stats.py", "--ids", ",".join(stats[:2])) == stats[:2]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--list", "--ids", "nope:1:1:add-sub"], capture_output=True
    )
    assert proc.returncode == 2 and b"unknown mutant id" in proc.stderr


def test_exit_status_and_report_become_verdicts(mutation: ModuleType) -> None:
    failure = {"property": "tests/fuzz/test_draft_properties.py::test_x", "error_type": "AssertionError"}
    killed = mutation.verdict(1, {"failures": [{**failure, "error": "a != b\nmore"}]}, 3.0, "")
    assert (killed.status, killed.killed_by, killed.error) == ("killed", "test_x", "AssertionError: a != b")
    target_error = (
        "target error: worker 0 could not collect the target (exit 4):\n  x\nE   ZeroDivisionError: boom"
    )
    collection = mutation.verdict(2, {"problems": [target_error]}, 3.0, "")
    assert (collection.status, collection.error) == ("killed at collection", "ZeroDivisionError: boom")
    assert mutation.verdict(0, {"failures": []}, 3.0, "").status == "survived"
    assert mutation.verdict(3, {}, 3.0, "worker died").status == "crashed"
    assert mutation.verdict(1, {"failures": []}, 3.0, "").status == "crashed"  # exit 1 needs a failure


def test_the_kill_rate_leaves_out_no_verdicts_and_likely_equivalents(mutation: ModuleType) -> None:
    rows = [
        {"id": "a", "status": "killed"},
        {"id": "b", "status": "killed at collection"},
        {"id": "c", "status": "survived", "triage": "likely equivalent"},
        {"id": "d", "status": "survived", "triage": "not reached"},
        {"id": "e", "status": "timed out"},
    ]
    summary = mutation.summarise(rows)
    assert summary["kill_rate"] == 2 / 4
    assert summary["kill_rate_without_equivalent"] == 2 / 3
    assert summary["no_verdict"] == 1
    assert summary["survivors"]["not reached"] == ["d"]


@pytest.mark.slow
def test_a_surely_killed_mutant_is_reported_killed(tmp_path: Path) -> None:
    # The loss's CE with the wrong sign: every property comparing values sees it.
    path = "draft_loss/soft_ce.py"
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    mutant = next(
        m
        for m in mutate.mutants_of_source((ROOT / path).read_text(encoding="utf-8"), path)
        if m.operator == "sub-add" and "ce = lse_s - dot / total_z" in lines[m.line - 1]
    )
    out = tmp_path / "mutation.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--ids", mutant.id, "--budget", "10", "--workers", "1"]
        + ["--no-baseline", "--no-reach", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert row["id"] == mutant.id
    assert row["status"] == "killed", proc.stdout
    assert row["property"].startswith("test_")
