"""Differential cases per second: random programs on simdist and on a warm gloo world.

Draws N programs from the campaign's strategy (a fixed seed: the same
programs every run), runs each on simdist and on the warm gloo worlds, and
prints cases per second for each side and for the pair. With --cold, the
gloo side is also measured the way the fixed differential suite runs it (a
new world per case through simdist.run_processes), side by side, and the
ratio printed: what keeping the world warm buys.

    python benchmarks/diff_rate.py              # 60 programs
    python benchmarks/diff_rate.py -n 200 --cold

Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "differential")]


def _programs(n: int, seed: int) -> list:
    import random

    from diff_strategies import programs
    from hypothesis import HealthCheck, Phase, given, settings

    drawn: list = []

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(p=programs())
    def draw(p: object) -> None:
        drawn.append(p)

    random.seed(seed)
    draw._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    draw()
    return drawn[:n]


def _cold_body(ctx, program):
    import diff_interpreter

    records: dict = {}
    groups = diff_interpreter.make_groups(program)
    diff_interpreter.run_rank(ctx.rank, program, groups, records.__setitem__)
    return records


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=60, help="programs")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--cold", action="store_true", help="also time a fresh gloo world per case")
    args = parser.parse_args()

    import diff_worlds

    programs = [p for p in _programs(args.n, args.seed) if not any(s["skip"] for s in p.steps)]
    # Warm-up: one world of each size (its start is paid once per campaign worker).
    t = time.perf_counter()
    for size in sorted({p.world for p in programs}):
        diff_worlds.gloo_worlds().get(size)
    print(f"starting {len({p.world for p in programs})} warm gloo worlds: {time.perf_counter() - t:.1f} s")

    sim_s = gloo_s = 0.0
    for p in programs:
        t0 = time.perf_counter()
        sim = diff_worlds.run_simdist(p)
        t1 = time.perf_counter()
        diff_worlds.run_gloo(p, expect_hang=bool(sim.hung))
        t2 = time.perf_counter()
        sim_s += t1 - t0
        gloo_s += t2 - t1
    n = len(programs)
    print(
        f"{n} programs (no skipped members), {diff_worlds.gloo_worlds().started} gloo worlds started in all"
    )
    print(f"  simdist:        {n / sim_s:7.1f} cases/s")
    print(f"  gloo (warm):    {n / gloo_s:7.1f} cases/s")
    print(f"  differential:   {n / (sim_s + gloo_s):7.1f} cases/s (both sides, comparison excluded)")
    if args.cold:
        from simdist import RankError, SimulationTimeout
        from simdist.launch import run_processes

        cold = programs[: max(5, n // 6)]
        t = time.perf_counter()
        for p in cold:
            try:
                run_processes(_cold_body, world_size=p.world, args=(p,), timeout=60)
            except (RankError, SimulationTimeout):
                pass
        cold_rate = len(cold) / (time.perf_counter() - t)
        print(f"  gloo (cold, a world per case, {len(cold)} programs): {cold_rate:7.2f} cases/s")
        print(f"  warm / cold: {n / gloo_s / cold_rate:.1f}x")
    diff_worlds.gloo_worlds().close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
