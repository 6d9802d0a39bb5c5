"""docs/schemas/: the published JSON Schemas hold for what simdist really writes.

A tiny campaign (tests/fuzz_targets/toy_properties.py: one property with a
planted bug, one clean) writes a real ``--report`` and a real case file; both
must validate, and so must every case kept in fixtures/regressions/. The
schemas are strict (``additionalProperties: false`` where simdist owns the
keys), so a field added to the report or the case file without documenting
it fails here.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "docs" / "schemas"
TOY = "tests/fuzz_targets/toy_properties.py"
REGRESSIONS = sorted((ROOT / "fixtures" / "regressions").glob("*.json"))


def validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


REPORT = validator("fuzz-report-1.json")
CASE = validator("fuzz-case-1.json")


def errors(v: jsonschema.protocols.Validator, data: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in v.iter_errors(data)]


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("campaign")
    report = tmp / "report.json"
    corpus = tmp / "corpus"
    proc = subprocess.run(
        [sys.executable, "-m", "simdist", "fuzz", "--budget", "3", "--seed", "3", "--database", "none"]
        + ["--corpus", str(corpus), "--report", str(report), "--tag", "origin=docs-test", TOY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = sorted(corpus.glob("*.json"))
    assert cases, "the planted bug's case was written"
    return {
        "report": json.loads(report.read_text(encoding="utf-8")),
        "cases": [json.loads(p.read_text(encoding="utf-8")) for p in cases],
    }


def test_a_real_report_validates_and_covers_every_part_of_the_schema(campaign: dict[str, Any]) -> None:
    report = campaign["report"]
    assert errors(REPORT, report) == []
    # The run exercised the parts of the schema that matter: a failure with its
    # case file, coverage, a clean property beside it, the tag.
    [failure] = report["failures"]
    assert failure["property"].endswith("::test_buggy_sum_matches_builtin") and failure["file"]
    assert report["coverage"] and report["cases_by_status"]["passed"] > 0
    assert report["tags"] == {"origin": "docs-test"} and report["exit_code"] == 1
    # A reader can tell the report's version as it can a case file's.
    assert report["format"] == "simdist-fuzz-report/1" == REPORT.schema["properties"]["format"]["const"]
    # Every documented top-level field is really written (no stale documentation).
    assert set(REPORT.schema["properties"]) == set(report)


def test_a_real_case_file_validates(campaign: dict[str, Any]) -> None:
    for case in campaign["cases"]:
        assert errors(CASE, case) == []
        assert case["found"]["origin"] == "docs-test"


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.name for p in REGRESSIONS])
def test_every_kept_regression_case_validates(path: Path) -> None:
    assert errors(CASE, json.loads(path.read_text(encoding="utf-8"))) == []


def test_the_case_schema_is_the_version_simdist_writes() -> None:
    from simdist.fuzz._corpus import FORMAT

    assert CASE.schema["properties"]["format"]["const"] == FORMAT
    assert CASE.schema["$id"].endswith(":" + FORMAT.rsplit("/", 1)[1])
    assert len(REGRESSIONS) >= 1


def test_the_schemas_refuse_what_simdist_does_not_write(campaign: dict[str, Any]) -> None:
    report = copy.deepcopy(campaign["report"])
    report["an_undocumented_field"] = 1
    assert any("an_undocumented_field" in e for e in errors(REPORT, report))
    report = copy.deepcopy(campaign["report"])
    report["failures"][0]["found_after_s"] = "soon"
    assert errors(REPORT, report)
    case = copy.deepcopy(campaign["cases"][0])
    case["format"] = "simdist-fuzz-case/2"
    assert errors(CASE, case)
    case = copy.deepcopy(campaign["cases"][0])
    case["target"] = "no_node_id.py"
    assert errors(CASE, case)
    case = copy.deepcopy(campaign["cases"][0])
    del case["case"]
    assert errors(CASE, case)


def test_the_case_file_shown_in_the_docs_validates() -> None:
    text = (ROOT / "docs" / "formats.md").read_text(encoding="utf-8")
    start = text.index("```json\n", text.index("## The case file")) + len("```json\n")
    shown = json.loads(text[start : text.index("```", start)])
    assert errors(CASE, shown) == []
