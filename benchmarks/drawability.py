"""Reach: the share of cases in which each strategy of the default campaign draws
each documented corner of draft_loss's input space (tests/fuzz/corners.py).

    python benchmarks/drawability.py                  # 2,000 draws per strategy
    python benchmarks/drawability.py --draws 500 --seeds 8

Draws as a campaign round does (generation only, random seeds, fixed here for
repeatability), so the shares are what a campaign spends its cases on; a
corner under the floor (5%) is marked. tests/fuzz/test_drawability.py fails
when one is. Prints; asserts nothing (exit status 1 if a corner is under its floor).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "fuzz"), str(ROOT / "tests" / "support")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100, help="cases per seed and strategy")
    parser.add_argument("--seeds", type=int, default=20, help="independent runs per strategy")
    args = parser.parse_args()
    from corners import FLOOR, draws, shares, targets

    under = 0
    for name, (strategy, corners) in targets().items():
        cases = draws(strategy, args.draws, range(args.seeds))
        print(f"\n{name} ({len(cases)} cases)")
        for corner, share in shares(cases, corners).items():
            mark = "" if share >= FLOOR else f"   UNDER THE {FLOOR:.0%} FLOOR"
            under += share < FLOOR
            print(f"  {corner:<36} {share:6.1%}{mark}")
    print(f"\n{under} corner(s) under the floor")
    return 1 if under else 0


if __name__ == "__main__":
    sys.exit(main())
