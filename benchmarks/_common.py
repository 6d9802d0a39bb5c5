"""What the mutant benchmarks share (diff_mutants.py, fuzz_mutants.py): a
catalogue of planted bugs loaded from its file, and one `simdist fuzz`
campaign against one of them, from scratch, stopping at the first failure.

Imported by bare name: a benchmark run as ``python benchmarks/NAME.py`` has
this folder first on its path.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from _harness import ROOT


def load_catalogue(path: Path, name: str, search: Sequence[Path] = ()) -> ModuleType:
    """The module at ``path`` (a catalogue of mutants), with ``search`` put
    first on the path for the modules it imports by bare name."""
    sys.path[:0] = [str(p) for p in search]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutants_parser(doc: str | None) -> argparse.ArgumentParser:
    """The benchmark's command line, starting with ``--mutants``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--mutants", default=None, help="comma-separated names (default: the whole catalogue)"
    )
    return parser


def campaign(
    mutant: str,
    env_var: str,
    *,
    budget: float,
    seed: int,
    workers: int,
    corpus: Path | None = None,
    target: str | None = None,
    tree: Path = ROOT,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], float, dict[str, Any]]:
    """Run `simdist fuzz [target]` in ``tree`` with ``env_var=mutant`` (a fresh
    example database; a fresh corpus unless ``corpus`` is given), stopping
    at the first failure. Returns the process, its wall seconds and its JSON
    report (empty when none was written)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "simdist.cli", "fuzz", *([target] if target else [])]
        command += ["--budget", str(budget), "--seed", str(seed), "--workers", str(workers), "-x"]
        command += ["--database", str(Path(tmp) / "db"), "--corpus", str(corpus or Path(tmp) / "corpus")]
        command += ["--report", str(report), "--tag", f"mutant={mutant}"]
        start = time.perf_counter()
        proc = subprocess.run(
            command,
            cwd=tree,
            capture_output=True,
            text=True,
            env={**(os.environ if env is None else env), env_var: mutant},
        )
        wall = time.perf_counter() - start
        data = json.loads(report.read_text()) if report.exists() else {}
    return proc, wall, data


def row(
    mutant: str, proc: subprocess.CompletedProcess[str], wall: float, data: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A campaign's outcome (whether it caught the mutant, and how soon), and
    its report's first failure (empty when none)."""
    failures = data.get("failures", [])
    first = failures[0] if failures else {}
    return {
        "mutant": mutant,
        "exit": proc.returncode,
        "wall_s": wall,
        "cases": data.get("cases", 0),
        "detected": proc.returncode == 1 and bool(failures),
        "first_failing_s": first.get("first_failing_case_after_s"),
        "reported_s": first.get("found_after_s"),
        "case": first.get("case"),
        "stderr_tail": proc.stderr[-1500:] if proc.returncode not in (0, 1) else "",
    }, first
