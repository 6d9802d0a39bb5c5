"""Bug-finding power: the default campaign against every mutant of the catalogue.

For each mutant in tests/fuzz/mutants.py, runs `simdist fuzz` (default budget,
one worker, a fresh example database, stop at the first failure) with
DRAFT_LOSS_MUTANT set, and prints the time to the first failing case, the time
until the shrunk case was reported, the property that caught it and the case.
A campaign that cannot find these bugs proves nothing when it finds none.

    python benchmarks/fuzz_mutants.py                     # every mutant, 60 s each
    python benchmarks/fuzz_mutants.py --mutants a,b --budget 30
    python benchmarks/fuzz_mutants.py --save-corpus fixtures/regressions
    python benchmarks/fuzz_mutants.py --mutants a,b --before /tmp/old-checkout   # side by side

``--before DIR`` runs each campaign a second time on the simdist of another
checkout (its tests/fuzz target, its simdist on PYTHONPATH), alternating with
this one, and prints both rows and the ratios of the time to the first case
(the workers' start-up) and to the first failing case.

Prints; asserts nothing. Exit status 1 if any mutant survived the budget.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from _common import ROOT, campaign, load_catalogue, mutants_parser, row


def catalogue() -> list[str]:
    fuzz = ROOT / "tests" / "fuzz"
    module = load_catalogue(fuzz / "mutants.py", "fuzz_mutants_catalogue", [ROOT / "tests" / "support", fuzz])
    return sorted(module.MUTANTS)


def _first_case_s(run_dir: Path) -> float | None:
    """Seconds from the campaign's start to its first case (any worker)."""
    times = []
    for path in run_dir.glob("worker-*.jsonl"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if '"e": "case"' in line:
                times.append(float(json.loads(line).get("t", 0.0)))
                break
    return min(times) if times else None


def hunt(mutant: str, budget: float, seed: int, corpus: Path, workers: int, tree: Path = ROOT) -> dict:
    env = None
    if tree != ROOT:
        env = {**os.environ, "PYTHONPATH": str(tree)}
    proc, wall, data = campaign(
        mutant,
        "DRAFT_LOSS_MUTANT",
        budget=budget,
        seed=seed,
        workers=workers,
        corpus=corpus,
        tree=tree,
        env=env,
    )
    out, first = row(mutant, proc, wall, data)
    out["first_case_s"] = _first_case_s(tree / data["run_dir"]) if data.get("run_dir") else None
    out["property"] = (first.get("property") or "").rsplit("::", 1)[-1]
    out["file"] = first.get("file")
    out["error"] = (first.get("error_type") or "") + ": " + (first.get("error") or "")[:160]
    return out


def main() -> int:
    parser = mutants_parser(__doc__)
    parser.add_argument(
        "--budget", type=float, default=60.0, help="seconds per campaign (the default campaign's budget)"
    )
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--save-corpus",
        type=Path,
        default=None,
        help="write each shrunk case here (e.g. fixtures/regressions), tagged with its mutant",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    parser.add_argument("--before", type=Path, default=None, help="another checkout to run side by side")
    args = parser.parse_args()
    names = args.mutants.split(",") if args.mutants else catalogue()
    trees = [("after", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.save_corpus or Path(tmp)
        for name in names:
            pair = {}
            for label, tree in trees:
                row = hunt(name, args.budget, args.seed, corpus.resolve(), args.workers, tree)
                row["tree"] = label
                rows.append(row)
                pair[label] = row
                _print_row(row, len(trees) > 1)
            if len(pair) == 2:
                _print_ratios(pair["before"], pair["after"])
    after = [r for r in rows if r["tree"] == "after"]
    caught = sum(r["detected"] for r in after)
    print(f"\n{caught}/{len(after)} mutants caught within {args.budget:g} s each")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if caught == len(after) else 1


def _seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "-"


def _print_row(row: dict, labelled: bool) -> None:
    status = "caught" if row["detected"] else f"SURVIVED (exit {row['exit']})"
    label = f"[{row['tree']}] " if labelled else ""
    print(
        f"{label}{row['mutant']:<40} {status:<10} first case {_seconds(row['first_case_s']):>7}  "
        f"first failing case {_seconds(row['first_failing_s']):>7}  "
        f"shrunk+reported {_seconds(row['reported_s']):>7}  by {row['property'] or '-'}  "
        f"({row['cases']} cases, {row['wall_s']:.0f} s wall)",
        flush=True,
    )
    if row["detected"]:
        print(f"    case: {json.dumps(row['case'], sort_keys=True)}")
        print(f"    {row['error']}")
    elif row["stderr_tail"]:
        print("    " + row["stderr_tail"].replace("\n", "\n    "))


def _print_ratios(before: dict, after: dict) -> None:
    parts = []
    for key, what in (("first_case_s", "first case"), ("first_failing_s", "first failing case")):
        if before.get(key) and after.get(key):
            parts.append(f"{what} {before[key] / after[key]:.2f}x sooner")
    print(f"    ratio before/after: {', '.join(parts) or '-'}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
