"""What an empty ``simdist.run`` costs, now and at another revision, in alternating processes.

An empty run (a body that returns at once) is all fixed cost: the world
built, the rank threads started, ``init_process_group`` in each rank, each
rank's first switch, the ranks' end, the patches and the teardown. Test
suites built on PyTorch's harnesses pay it once per test. Each round runs a
fresh child process per revision (the order alternating between rounds),
each child times ``--runs`` empty runs per world after a warm-up, with
DTensor imported (as torch's harness modules import it), and reports the
median wall time and the mean CPU time of the process per run. The table is
the median over rounds, per revision, and the ratio. CPU time is the
steadier figure on a shared machine; the load average is printed before
and after. Prints, never asserts.

    python benchmarks/run_cost.py --before main~3
    python benchmarks/run_cost.py --before 9628ef8 --rounds 8 --worlds 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from _harness import ROOT, ChildFailed, alternate, child_json, exported, load_line, table


def _child(runs: int, worlds: list[int]) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed.tensor  # (the harness modules import it)

    import simdist

    def body(ctx: Any) -> None:
        return None

    out: dict[str, Any] = {"simdist": str(Path(simdist.__file__).parent.parent)}
    for world in worlds:
        for _ in range(20):
            simdist.run(body, world_size=world)
        walls = []
        cpu0 = time.process_time()
        for _ in range(runs):
            t0 = time.perf_counter()
            simdist.run(body, world_size=world)
            walls.append(time.perf_counter() - t0)
        cpu = (time.process_time() - cpu0) / runs
        out[str(world)] = {"wall": statistics.median(walls), "cpu": cpu}
    print(json.dumps(out))


def _measure(label: str, tree: Path, runs: int, worlds: list[int]) -> dict[str, Any]:
    try:
        result = child_json(__file__, ["--child", runs, ",".join(map(str, worlds))], path=[tree], timeout=600)
    except ChildFailed as exc:
        raise SystemExit(f"the child for {label} failed:\n{(exc.stderr or str(exc))[-2000:]}") from None
    if Path(result["simdist"]).resolve() != tree.resolve():
        raise SystemExit(f"the child for {label} imported another simdist than its own tree's")
    return result


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", metavar="REV", help="the git revision to compare with (required)")
    parser.add_argument("--rounds", type=int, default=6, help="child processes per revision (default 6)")
    parser.add_argument(
        "--runs", type=int, default=300, help="empty runs per world in each child (default 300)"
    )
    parser.add_argument("--worlds", default="1,2,4,8", help="comma-separated world sizes (default 1,2,4,8)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        _child(int(opts.child[0]), [int(w) for w in opts.child[1].split(",")])
        return
    if not opts.before:
        parser.error("--before REV is required: the revision to compare this checkout with")
    try:
        worlds = [int(w) for w in opts.worlds.split(",")]
    except ValueError:
        parser.error(f"--worlds must be comma-separated integers, got {opts.worlds!r}")
    if not worlds or min(worlds) < 1:
        parser.error(f"--worlds must name world sizes of 1 or more, got {opts.worlds!r}")
    if opts.rounds < 1 or opts.runs < 1:
        parser.error("--rounds and --runs must be 1 or more")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    now_label = f"now ({head.stdout.strip() or 'this checkout'})"
    print(
        f"empty simdist.run; {load_line('at the start')}; {opts.rounds} rounds x {opts.runs} runs per world"
    )
    with exported(opts.before, "simdist") as before_tree:
        trees = {now_label: ROOT, opts.before: before_tree}
        results = alternate(
            list(trees), opts.rounds, lambda label: _measure(label, trees[label], opts.runs, worlds)
        )
    print()
    rows = []
    for world in worlds:
        key = str(world)
        w0 = statistics.median(x[key]["wall"] for x in results[opts.before])
        w1 = statistics.median(x[key]["wall"] for x in results[now_label])
        c0 = statistics.median(x[key]["cpu"] for x in results[opts.before])
        c1 = statistics.median(x[key]["cpu"] for x in results[now_label])
        rows.append([world, _fmt(w0), _fmt(w1), f"{w1 / w0:.2f}x", _fmt(c0), _fmt(c1), f"{c1 / c0:.2f}x"])
    headers = [
        "world",
        f"wall, {opts.before}",
        "wall, now",
        "ratio",
        f"CPU, {opts.before}",
        "CPU, now",
        "ratio",
    ]
    table(headers, rows, markdown=True)
    print(f"\n{now_label}; ratio: now / {opts.before}. {load_line('at the end')}.")


if __name__ == "__main__":
    main()
