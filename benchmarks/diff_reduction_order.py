"""Which summation order does gloo use? Bitwise agreement of simdist's reduction models with gloo.

For world sizes 3..6 and float dtypes, all-reduces (SUM) normal random data
of a few sizes on a warm gloo world and on simdist under each reduction model
("rank", "ring", "tree"), and prints the fraction of results that are
bitwise identical to gloo's. A model at 100% reproduces gloo's order for
those cases; docs/differences.md quotes the table.

    python benchmarks/diff_reduction_order.py

Prints; asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "differential")]

MODELS = ("rank", "ring", "tree")


def main() -> int:
    import diff_worlds
    import torch
    from diff_program import Program, step

    print(f"{'world':>5} {'dtype':>9} {'numel':>6}  " + "  ".join(f"{m:>6}" for m in MODELS))
    for world in (3, 4, 5, 6):
        for dtype in ("float32", "bfloat16", "float16"):
            for numel in (1, 7, 64):
                seeds = range(6)
                same = dict.fromkeys(MODELS, 0)
                for seed in seeds:
                    program = Program(
                        world, seed, (step("all_reduce", dtype=dtype, shape=[numel], values="randn"),)
                    )
                    gloo = diff_worlds.run_gloo(program).ranks[0][0]["values"]["t"]
                    for model in MODELS:
                        sim = diff_worlds.run_simdist(program, reduction=model).ranks[0][0]["values"]["t"]
                        same[model] += int(torch.equal(gloo, sim))
                cells = "  ".join(f"{100 * same[m] / len(seeds):5.0f}%" for m in MODELS)
                print(f"{world:>5} {dtype:>9} {numel:>6}  {cells}", flush=True)
    diff_worlds.gloo_worlds().close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
