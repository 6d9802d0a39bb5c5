"""What float32 (or bfloat16) costs the co-training step, case by case: the measurement behind
``SHADOW_SPREAD`` (tests/fuzz/draft_runs.py).

    python benchmarks/float32_cost.py                 # 8 seeds x 50 draws
    python benchmarks/float32_cost.py --seeds 40 --first-seed 8
    python benchmarks/float32_cost.py --dtype bfloat16 --seeds 48

For every float32 (or bfloat16) case the default campaign's case strategy draws (generation
only, seeds fixed here), runs the step monolithic and split and measures, each
as a fraction of the float64 reference's largest gradient entry:

- mono, split: the worst gradient entry of either mode against float64;
- s-m: split against monolithic;
- shadow: the shadow (the reference's maths in the case's dtype, one process)
  against float64, the case's cost as the fuzz properties measure it.

and prints the ratio max(mono, split, s-m / 2) / shadow: the properties allow a
run SHADOW_SPREAD times its shadow (split against monolithic twice that), so
the worst ratio printed is the margin that constant has. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time

from _harness import ROOT, table

sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "fuzz"), str(ROOT / "tests" / "support")]


def measure(case) -> tuple[float, float, float, float] | None:
    """(mono, split, s-m, shadow) of one case, or None where every gradient is zero."""
    from cotrain_harness import reference_of, shard
    from draft_runs import run_valid

    config, batch = case.config(), case.global_batch()
    exact, shadow = reference_of(config, batch), reference_of(config, batch, dtype=case.torch_dtype)
    scale = max((float(g.abs().max()) for g in exact.grads.values() if g.numel()), default=0.0)
    if scale == 0.0:
        return None
    runs = run_valid(case, ("monolithic", "split"))
    layout = case.layout

    def worst(pairs) -> float:
        return max((float((a.double() - b.double()).abs().max()) for a, b in pairs if b.numel()), default=0.0)

    def against_exact(mode: str) -> float:
        return worst(
            (result.grads[name], shard(exact.grads[name], name, layout.coords(rank).tp, layout.tp))
            for rank, result in enumerate(runs[mode])
            for name in result.grads
        )

    split_vs_mono = worst(
        (result.grads[name], runs["monolithic"][rank].grads[name])
        for rank, result in enumerate(runs["split"])
        for name in result.grads
    )
    cost = worst((shadow.grads[name], g) for name, g in exact.grads.items())
    return (
        against_exact("monolithic") / scale,
        against_exact("split") / scale,
        split_vs_mono / scale,
        cost / scale,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=50, help="cases per seed")
    parser.add_argument("--seeds", type=int, default=8, help="independent draws")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="worst cases to print")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="the cases' dtype (bfloat16: not under the shuffled order, whose modes' gradients are not compared)",
    )
    args = parser.parse_args()
    from corners import draws
    from draft_cases import draft_cases
    from draft_runs import SHADOW_SPREAD, gradients_judged_split_vs_monolithic

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    cases = [
        c
        for c in draws(draft_cases(), args.draws, seeds)
        if c.dtype == args.dtype and gradients_judged_split_vs_monolithic(c)
    ]
    print(f"{len(cases)} {args.dtype} cases drawn (seeds {seeds.start}..{seeds.stop - 1})", flush=True)
    start = time.monotonic()
    rows: list[tuple[float, float, float, float, float]] = []
    for case in cases:
        row = measure(case)
        if row is not None:
            mono, split, apart, cost = row
            rows.append((max(mono, split, apart / 2) / max(cost, 1e-12), *row))
    if not rows:
        print("no case with a nonzero gradient")
        return 0
    rows.sort(reverse=True)
    ratios = sorted(r[0] for r in rows)
    quantile = {q: ratios[min(len(ratios) - 1, int(len(ratios) * q))] for q in (0.5, 0.9, 0.99)}
    print(f"{len(rows)} measured in {time.monotonic() - start:.0f} s")
    print(
        "ratio run/shadow: "
        + ", ".join(f"{q:.0%} {v:.2f}" for q, v in quantile.items())
        + f", max {ratios[-1]:.2f}"
    )
    print(f"margin of SHADOW_SPREAD = {SHADOW_SPREAD:g}: {SHADOW_SPREAD / ratios[-1]:.1f}x")
    apart = sorted(r[3] / max(r[4], 1e-12) for r in rows)
    print(
        "split against monolithic / shadow: "
        + ", ".join(
            f"{q:.0%} {apart[min(len(apart) - 1, int(len(apart) * q))]:.2f}" for q in (0.5, 0.9, 0.99)
        )
        + f", max {apart[-1]:.2f}"
    )
    print(f"\nworst {min(args.show, len(rows))}:")
    worst = [[f"{row[0]:.2f}", *(f"{x:.2e}" for x in row[1:])] for row in rows[: args.show]]
    table(["ratio", "mono", "split", "s-m", "shadow"], worst, align=">")
    return 0


if __name__ == "__main__":
    sys.exit(main())
