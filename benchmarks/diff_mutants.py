"""Bug-finding power of the differential campaign: every planted simdist bug, from scratch.

For each mutant in tests/differential/simdist_mutants.py, runs `simdist fuzz
tests/differential` (a fresh example database, stop at the first failure)
with SIMDIST_MUTANT set, and prints the time to the first failing case, the
time until the shrunk case was reported, and the case. A differential
campaign that cannot find these bugs proves nothing when it finds none.

    python benchmarks/simdist_mutants.py                      # every mutant, 300 s each
    python benchmarks/simdist_mutants.py --mutants max_as_min --budget 60

Prints; asserts nothing. Exit status 1 if any mutant survived the budget.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = "tests/differential"


def catalogue() -> tuple[list[str], dict[str, str]]:
    sys.path[:0] = [str(ROOT / TARGET)]
    spec = importlib.util.spec_from_file_location(
        "simdist_mutants_catalogue", ROOT / TARGET / "simdist_mutants.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(module.MUTANTS), dict(module.FAMILIES)


def hunt(mutant: str, budget: float, seed: int, workers: int, grace: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        start = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "simdist.cli",
                "fuzz",
                TARGET,
                "--budget",
                str(budget),
                "--seed",
                str(seed),
                "--workers",
                str(workers),
                "-x",
                "--database",
                str(Path(tmp) / "db"),
                "--corpus",
                str(Path(tmp) / "corpus"),
                "--report",
                str(report),
                "--tag",
                f"mutant={mutant}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "SIMDIST_MUTANT": mutant},
        )
        wall = time.perf_counter() - start
        data = json.loads(report.read_text()) if report.exists() else {}
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
        "error": (first.get("error") or "")[:300],
        "stderr_tail": proc.stderr[-1500:] if proc.returncode not in (0, 1) else "",
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mutants", default=None, help="comma-separated names (default: the whole catalogue)"
    )
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per campaign")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--grace", type=float, default=60.0, help="seconds to shrink a failure past the budget"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    names, families = catalogue()
    if args.mutants:
        names = args.mutants.split(",")
    rows = []
    for name in names:
        row = hunt(name, args.budget, args.seed, args.workers, args.grace)
        rows.append(row)
        status = "caught" if row["detected"] else f"SURVIVED (exit {row['exit']})"
        first = f"{row['first_failing_s']:.1f} s" if row["first_failing_s"] is not None else "-"
        shrunk = f"{row['reported_s']:.1f} s" if row["reported_s"] is not None else "-"
        print(
            f"{name:<44} {families.get(name, '?'):<22} {status:<10} first failing case {first:>7}  "
            f"shrunk+reported {shrunk:>7}  ({row['cases']} cases, {row['wall_s']:.0f} s wall)",
            flush=True,
        )
        if row["detected"]:
            print(f"    case: {json.dumps(row['case'], sort_keys=True)}")
        elif row["stderr_tail"]:
            print("    " + row["stderr_tail"].replace("\n", "\n    "))
    caught = sum(r["detected"] for r in rows)
    print(f"\n{caught}/{len(rows)} mutants caught within {args.budget:g} s each")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
