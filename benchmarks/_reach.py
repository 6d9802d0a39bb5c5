"""Which lines of a package the campaign's properties run: one derandomised
pytest pass over the target with a line tracer on every Python thread.

Run by benchmarks/mutation.py as a script in the exported copy of the
repository (cwd and PYTHONPATH the copy):

    python _reach.py OUT.json [TARGET ...]

Writes ``{"package_file": ..., "exit": ..., "failed": [nodeid, ...], "lines": {path: [line, ...]}}``,
paths relative to the current directory. Without TARGET, the campaign's
default target (``[tool.simdist] fuzz-targets``). Rank threads are Python
threads, started after the tracer is installed, so ``threading.settrace``
sees them; frames outside the package cost one call of the global tracer.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGE = "draft_loss"
PROFILE = "simdist-mutation-reach"
EXAMPLES = 20

Tracer = Callable[[FrameType, str, Any], Any]


def line_tracer(prefix: str, hits: dict[str, set[int]]) -> Tracer:
    """A global trace function that records the lines run in files under ``prefix``."""
    wanted: dict[str, bool] = {}

    def tracer(frame: FrameType, event: str, arg: Any) -> Tracer | None:
        filename = frame.f_code.co_filename
        traced = wanted.get(filename)
        if traced is None:
            traced = wanted[filename] = filename.startswith(prefix)
        if not traced:
            return None
        lines = hits.setdefault(filename, set())
        lines.add(frame.f_lineno)

        def local(frame: FrameType, event: str, arg: Any) -> Tracer:
            if event == "line":
                lines.add(frame.f_lineno)
            return local

        return local

    return tracer


class FailedTests:
    """A pytest plugin noting the tests that failed: the unmutated target should pass."""

    def __init__(self) -> None:
        self.nodeids: list[str] = []

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self.nodeids.append(report.nodeid)


def _register_profile() -> None:
    # The folder profiles' cases, more of them, and the same ones every run.
    from hypothesis import HealthCheck, settings

    relaxed = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile(
        PROFILE,
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=relaxed,
    )


def _package_file(root: Path) -> str:
    """Where the package was imported from: relative when from ``root``, else
    ``<elsewhere>`` (the caller refuses it; no path of this machine is written)."""
    module_file = getattr(sys.modules.get(PACKAGE), "__file__", None) or ""
    path = Path(module_file).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else "<elsewhere>"


def main(argv: list[str]) -> int:
    out, targets = Path(argv[0]), argv[1:]
    root = Path.cwd().resolve()
    if not targets:
        from simdist.fuzz._campaign import default_targets

        targets = default_targets(root)
    import pytest

    _register_profile()
    failed = FailedTests()
    hits: dict[str, set[int]] = {}
    tracer = line_tracer(str(root / PACKAGE) + os.sep, hits)
    threading.settrace(tracer)
    sys.settrace(tracer)
    try:
        args = [*targets, "-p", "no:cacheprovider", "-o", "addopts=", "-q", "--no-header"]
        code = int(pytest.main([*args, f"--hypothesis-profile={PROFILE}"], plugins=[failed]))
    finally:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type,unused-ignore]  # None removes it; typeshed says no
    result = {
        "package_file": _package_file(root),
        "exit": code,
        "failed": failed.nodeids,
        "lines": {os.path.relpath(f, root).replace(os.sep, "/"): sorted(lines) for f, lines in hits.items()},
    }
    out.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
