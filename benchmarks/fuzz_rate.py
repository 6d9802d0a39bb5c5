"""How fast the default fuzz campaign runs, and where a case's time goes.

Three measurements, printed side by side from one run:

1. The default campaign (`simdist fuzz` on tests/fuzz, one worker, fresh
   database): cases per second overall and per property.
2. The same co-training step (monolithic + split on one world, as the
   properties run it) on simdist and on a spawned gloo world, per case, for
   layouts of 2, 4 and 8 ranks: the ratio is what simulating buys a campaign.
3. Where a simdist case's time goes: starting and tearing down the world, the
   float64 reference, the collectives (their count from CommStats times the
   measured cost of one small collective at that world size), and the rest
   (the ranks' own compute and Python).

    python benchmarks/fuzz_rate.py                 # 60 s campaign + side by side
    python benchmarks/fuzz_rate.py --budget 20 --reps 3 --no-gloo

Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "fuzz"), str(ROOT / "tests")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import simdist  # noqa: E402
from cotrain_harness import reference_of  # noqa: E402
from draft_cases import DraftCase  # noqa: E402
from draft_runs import _modes_body  # noqa: E402

LAYOUTS = [simdist.Layout(tp=2), simdist.Layout(tp=2, dp=2), simdist.Layout(tp=2, dp=2, pp=2)]


def campaign(budget: float, workers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "simdist.cli", "fuzz", "--budget", str(budget), "--workers", str(workers),
             "--seed", "1", "--database", str(Path(tmp) / "db"), "--no-corpus", "--report", str(report)],
            cwd=ROOT, capture_output=True, text=True, check=False,
        )
        data = json.loads(report.read_text())
        seconds: dict[str, float] = defaultdict(float)
        cases: dict[str, int] = defaultdict(int)
        for path in Path(data["run_dir"]).glob("worker-*.jsonl"):
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event["e"] == "round":
                    seconds[event["p"]] += event["sec"]
                    cases[event["p"]] += event["cases"]
    print(f"1. default campaign: {data['cases']} cases in {data['elapsed_s']:.1f} s with {workers} worker(s) "
          f"= {data['cases'] / data['elapsed_s']:.1f} cases/s (worker start-up included); "
          f"{len(data['distinct_layouts'])} distinct layouts, {len(data['failures'])} failure(s)")
    for prop in sorted(seconds):
        rate = cases[prop] / seconds[prop] if seconds[prop] else 0.0
        print(f"   {prop.rsplit('::', 1)[-1]:<52} {cases[prop]:>6} cases {rate:8.1f} cases/s")


def case_for(layout: simdist.Layout) -> DraftCase:
    seq, rows, micro = 6, 2, 2
    masks = tuple(tuple(tuple(tuple(1.0 if (r + p + d) % 3 else 0.0 for p in range(seq)) for r in range(rows))
                        for _ in range(micro)) for d in range(layout.dp))
    return DraftCase(tp=layout.tp, dp=layout.dp, pp=layout.pp, microbatches=micro, seq_len=seq, masks=masks,
                     vocab_size=8 * layout.tp, token_chunk_size=5, dtype="float32", bin_weights=(1.0, 0.5),
                     single_bin=None, seed=3, reduction="rank", reduction_seed=0, clip=False)


def _step_args(case: DraftCase):
    return (case, case.config(), case.batches(), ("monolithic", "split"))


def time_simdist(case: DraftCase, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        simdist.run(_modes_body, layout=case.layout, args=_step_args(case))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_gloo(case: DraftCase, reps: int) -> float:
    simdist.run_processes(_noop, layout=case.layout, backend="gloo", timeout=300)  # warm the forkserver
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        simdist.run_processes(_modes_body, layout=case.layout, args=_step_args(case), backend="gloo", timeout=300)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _noop(ctx) -> None:
    return None


def _small_all_reduce(ctx, n: int) -> None:
    t = torch.ones(4)
    for _ in range(n):
        dist.all_reduce(t, group=ctx.groups.tp if ctx.layout.tp > 1 else ctx.groups.world)


def breakdown(case: DraftCase, reps: int) -> tuple[float, float, float, float, int]:
    layout = case.layout
    total = time_simdist(case, reps)
    world = statistics.median(_timed(lambda: simdist.run(_noop, layout=layout)) for _ in range(reps))
    reference = statistics.median(_timed(lambda: reference_of(case.config(), case.global_batch())) for _ in range(reps))
    with simdist.CommStats() as stats:
        simdist.run(_modes_body, layout=layout, args=_step_args(case))
    calls = stats.count().calls // layout.world_size  # calls per rank
    n = 200
    per_call = (statistics.median(_timed(lambda: simdist.run(_small_all_reduce, layout=layout, args=(n,)))
                                  for _ in range(reps)) - world) / n
    return total, world, reference, per_call * calls, calls


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-campaign", action="store_true")
    parser.add_argument("--no-gloo", action="store_true")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    if not args.no_campaign:
        campaign(args.budget, args.workers)
    print("2. one case (monolithic + split step on one world), median of", args.reps)
    print(f"   {'layout':<22} {'simdist':>10} {'gloo':>10} {'gloo/simdist':>13}")
    for layout in LAYOUTS:
        case = case_for(layout)
        sim = time_simdist(case, args.reps)
        gloo = float("nan") if args.no_gloo else time_gloo(case, max(1, args.reps // 2))
        print(f"   {str(layout):<22} {sim * 1e3:8.1f} ms {gloo * 1e3:8.1f} ms {gloo / sim:12.1f}x")
    print("3. where a simdist case's time goes (per case; collectives estimated as calls x one small call's cost)")
    print(f"   {'layout':<22} {'total':>9} {'world':>9} {'reference':>10} {'collectives':>12} {'calls/rank':>10} {'rest':>9}")
    for layout in LAYOUTS:
        total, world, reference, comm, calls = breakdown(case_for(layout), args.reps)
        rest = total - world - comm
        print(f"   {str(layout):<22} {total * 1e3:7.1f}ms {world * 1e3:7.1f}ms {reference * 1e3:8.1f}ms "
              f"{comm * 1e3:10.1f}ms {calls:>10} {rest * 1e3:7.1f}ms")
    print("   (the reference runs once per case in the property, outside the world; 'rest' is the ranks' own work)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
