"""How long a run of busy ranks takes to end after its watchdog's timeout.

Every rank computes forever; ``run(..., timeout=T)`` must end about T seconds
after it was called (thread start-up counts against the deadline) plus the
time to interrupt the ranks. Prints, per schedule and world size, the
elapsed time and its ratio to T. Prints, never asserts.

    python benchmarks/watchdog.py --sizes 8,32 --timeout 1
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

try:
    import simdist
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import simdist


def busy(ctx: simdist.RankContext) -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32")
    parser.add_argument("--timeout", type=float, default=1.0)
    args = parser.parse_args()
    print(f"{'schedule':<11} {'ranks':>5} {'elapsed':>8} {'x timeout':>9}")
    for n in [int(x) for x in args.sizes.split(",")]:
        for schedule in ("rank", "random", "concurrent"):
            start = time.monotonic()
            try:
                simdist.run(busy, world_size=n, timeout=args.timeout, schedule=schedule)
            except simdist.SimulationTimeout:
                pass
            elapsed = time.monotonic() - start
            print(f"{schedule:<11} {n:>5} {elapsed:>7.2f}s {elapsed / args.timeout:>9.2f}")


if __name__ == "__main__":
    main()
