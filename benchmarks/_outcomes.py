"""A pytest plugin for the benchmarks: each test's phases, appended to a JSON
lines file as they end (``SIMDIST_OUTCOMES=path``), so a run that crashes
or is killed keeps every result it reached and names the test it was in.

    python -m pytest -p _outcomes FILE     # with benchmarks/ on PYTHONPATH

Lines: ``{"start": nodeid}`` when a test begins, then one
``{"nodeid", "when", "outcome", "duration", "message"}`` a phase.
"""

from __future__ import annotations

import json
import os
from typing import Any


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("SIMDIST_OUTCOMES")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()


def _message(report: Any) -> str:
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    text = getattr(report, "longreprtext", "") or ""
    # The last "E   ..." line is the exception that ended the test; a
    # harness failure's text holds the rank's own traceback further up.
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    lines = [e for e in errors if e] or [line for line in text.splitlines() if line.strip()]
    picked = [line for line in lines if "Error" in line or "Exception" in line or "exited" in line]
    return ((picked or lines or [""])[-1])[:400]


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _write({"start": nodeid})


def pytest_runtest_logreport(report: Any) -> None:
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xpassed" if report.passed else "xfailed"
    _write(
        {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": outcome,
            "duration": round(report.duration, 3),
            "message": _message(report),
        }
    )
