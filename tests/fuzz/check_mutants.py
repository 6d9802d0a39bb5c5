"""Which property catches each mutant, after how many cases and seconds (a by-hand check).

    PYTHONPATH=. python tests/fuzz/check_mutants.py [--examples 200] [--seed 0] [MUTANT ...]

Each mutant runs in a fresh process: its properties run one after another
(cheapest first) under plain Hypothesis with random generation (no shrinking,
no database) until one fails or each has run ``--examples`` cases. Prints
one row per mutant. The campaign runner's own benchmark is the reference
figure; this is for checking a new mutant or property quickly.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ORDER = (
    "test_soft_ce_matches_reference",
    "test_soft_ce_bad_input_fails_on_every_tp_rank",
    "test_split_equals_monolithic",
    "test_layout_invariance",
    "test_bad_input_fails_on_every_rank",
    "test_fault_then_retry_equals_clean_run",
    "test_valid_input_never_raises_simulation_error",
    "test_projected_soft_ce_matches_reference",
    "test_lifecycle_matches_float64_model",
)


def _one(mutant: str, examples: int, seed: int) -> dict[str, object]:
    for folder in (HERE, HERE.parent / "support"):
        sys.path.insert(0, str(folder))
    from hypothesis import HealthCheck, Phase, settings

    settings.register_profile(
        "check-mutants",
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate, Phase.target],
        suppress_health_check=list(HealthCheck),
    )
    settings.load_profile("check-mutants")
    if "OMP_NUM_THREADS" not in os.environ:
        # As the campaign's workers: one intra-op thread (see simdist.fuzz._campaign).
        import torch

        torch.set_num_threads(1)
    import mutants

    if mutant != "none":
        mutants.apply(mutant)
    import test_draft_properties as properties

    import simdist.fuzz

    cases = {"n": 0}
    cover = simdist.fuzz.cover

    def counting_cover(**features: object) -> None:
        cases["n"] += 1
        cover(**features)

    simdist.fuzz.cover = counting_cover
    start = time.perf_counter()
    for name in ORDER:
        test = getattr(properties, name)
        cases["n"] = 0
        began = time.perf_counter()
        try:
            from hypothesis import seed as hypothesis_seed

            hypothesis_seed(seed)(test)()
        except BaseException as error:
            return {
                "mutant": mutant,
                "caught_by": name,
                "cases": cases["n"],
                "seconds": round(time.perf_counter() - began, 1),
                "total_seconds": round(time.perf_counter() - start, 1),
                "error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}",
            }
    return {
        "mutant": mutant,
        "caught_by": None,
        "cases": None,
        "total_seconds": round(time.perf_counter() - start, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mutants", nargs="*", help="mutant names (default: all)")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.examples, args.seed)))
        return 0
    sys.path.insert(0, str(HERE))
    import mutants

    names = args.mutants or sorted(mutants.MUTANTS)
    for name in names:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                name,
                "--examples",
                str(args.examples),
                "--seed",
                str(args.seed),
            ],
            capture_output=True,
            text=True,
            env=os.environ.copy(),
        )
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        print(lines[-1] if lines else json.dumps({"mutant": name, "crashed": out.stderr[-2000:]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
