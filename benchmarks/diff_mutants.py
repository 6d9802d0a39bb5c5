"""Bug-finding power of the differential campaign: every planted simdist bug, from scratch.

For each mutant in tests/differential/simdist_mutants.py, runs `simdist fuzz
tests/differential` (a fresh example database, stop at the first failure)
with SIMDIST_MUTANT set, and prints the time to the first failing case, the
time until the shrunk case was reported, and the case. A differential
campaign that cannot find these bugs proves nothing when it finds none.

    python benchmarks/diff_mutants.py                      # every mutant, 300 s each
    python benchmarks/diff_mutants.py --mutants max_as_min --budget 60

Prints; asserts nothing. Exit status 1 if any mutant survived the budget.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from _common import ROOT, campaign, load_catalogue, mutants_parser, row

TARGET = "tests/differential"


def catalogue() -> tuple[list[str], dict[str, str]]:
    module = load_catalogue(
        ROOT / TARGET / "simdist_mutants.py", "simdist_mutants_catalogue", [ROOT / TARGET]
    )
    return sorted(module.MUTANTS), dict(module.FAMILIES)


def hunt(mutant: str, budget: float, seed: int, workers: int, grace: float) -> dict:
    proc, wall, data = campaign(
        mutant, "SIMDIST_MUTANT", budget=budget, seed=seed, workers=workers, target=TARGET
    )
    out, first = row(mutant, proc, wall, data)
    out["error"] = (first.get("error") or "")[:300]
    return out


def main() -> int:
    parser = mutants_parser(__doc__)
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
