"""How fast the default fuzz campaign runs, and where a case's time goes.

Measurements, printed side by side from one run:

1. The default campaign (`simdist fuzz` on tests/fuzz, fresh database):
   cases per second overall and per property.
2. The same co-training step (monolithic + split on one world, as the
   properties run it) on simdist and on a spawned gloo world, per case, for
   layouts of 2, 4 and 8 ranks: the ratio is what simulating buys a campaign.
   Both sides run the same body on the same arguments; neither runs the
   float64 reference or the checks. Each gloo case starts a world of fresh
   processes (forked from a server with torch imported), as a campaign over
   varying layouts must. Two gloo figures: "gloo" imports the test modules
   in every new process (what `simdist.run_processes` does by default);
   "gloo, preloaded" forks from a server that already imported them (in a
   subprocess of this script, the best a gloo campaign could do). The
   ratio is taken against the faster of the two.
3. Where a simdist case's time goes, and the floor: the world's start and
   teardown (an empty body), the ranks' compute measured inside the world
   (each rank thread's CPU time in the body outside torch.distributed calls),
   simdist's own CPU inside those calls, and the rest (handing the run token
   between rank threads, the caller's thread, other processes on the
   machine). The compute floor runs every rank's body one after another in
   this thread with the collectives replaced by no-ops: what the ranks' own
   work costs in one process with no simulator at all. "best ratio" is gloo's
   time over (world start + compute floor): the most a thread-per-rank
   simulator that runs one rank at a time could reach on this machine.

    python benchmarks/fuzz_rate.py                 # 60 s campaign + side by side
    python benchmarks/fuzz_rate.py --budget 20 --reps 3 --no-gloo
    python benchmarks/fuzz_rate.py --before main --rounds 3 --budget 60 --campaign-only

Both sides use one intra-op thread per rank (gloo's workers set that
themselves, like torchrun; `--threads` changes simdist's side). Prints;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from _harness import ROOT, ChildFailed, alternate, child_json, exported, load_line

sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "fuzz"), str(ROOT / "tests" / "support")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from draft_cases import DraftCase  # noqa: E402
from draft_runs import _modes_body  # noqa: E402

import simdist  # noqa: E402

LAYOUTS = [simdist.Layout(tp=2), simdist.Layout(tp=2, dp=2), simdist.Layout(tp=2, dp=2, pp=2)]
# Modules a gloo world's processes import to unpickle the body: what the
# "preloaded" forkserver imports once.
BODY_MODULES = [
    "torch",
    "torch.distributed",
    "simdist.launch",
    "draft_runs",
    "cotrain_harness",
    "draft_cases",
]


def campaign(budget: float, workers: int, root: Path = ROOT, label: str = "") -> float:
    """One default campaign in ``root`` (a checkout; another revision's runs on
    its own simdist, put first on the path). Prints it; returns its cases/s."""
    env = dict(os.environ)
    if root != ROOT:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(root), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        )
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "simdist.cli",
                "fuzz",
                "--budget",
                str(budget),
                "--workers",
                str(workers),
                "--seed",
                "1",
                "--database",
                str(Path(tmp) / "db"),
                "--no-corpus",
                "--report",
                str(report),
            ],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        data = json.loads(report.read_text())
        seconds: dict[str, float] = defaultdict(float)
        cases: dict[str, int] = defaultdict(int)
        ready: list[float] = []  # per worker: seconds from the campaign's start to its first round
        for path in (root / data["run_dir"]).glob("worker-*.jsonl"):  # relative to the campaign's folder
            rounds = [e for e in map(json.loads, path.read_text().splitlines()) if e["e"] == "round"]
            for event in rounds:
                seconds[event["p"]] += event["sec"]
                cases[event["p"]] += event["cases"]
            if rounds:
                ready.append(rounds[0]["t"] - rounds[0]["sec"])
    rate = data["cases"] / data["elapsed_s"]
    print(
        f"1. default campaign{label}: {data['cases']} cases in {data['elapsed_s']:.1f} s with {workers} worker(s) "
        f"= {data['cases'] / data['elapsed_s']:.1f} cases/s (worker start-up included); "
        f"{len(data['distinct_layouts'])} distinct layouts, {len(data['failures'])} failure(s); "
        f"workers ready after {', '.join(f'{t:.1f}' for t in sorted(ready))} s"
    )
    for prop in sorted(seconds):
        per = cases[prop] / seconds[prop] if seconds[prop] else 0.0
        print(f"   {prop.rsplit('::', 1)[-1]:<52} {cases[prop]:>6} cases {per:8.1f} cases/s")
    return rate


def campaigns_before_after(budget: float, workers: int, rev: str, rounds: int) -> None:
    """The default campaign now and as of ``rev``, alternating, ``rounds`` each."""
    with exported(rev) as before:
        trees = {"now": ROOT, rev: before}
        rates = alternate(
            list(trees), rounds, lambda name: campaign(budget, workers, trees[name], label=f" ({name})")
        )
    now, old = statistics.median(rates["now"]), statistics.median(rates[rev])
    print(
        f"   median of {rounds}: now {now:.1f} cases/s, {rev} {old:.1f} cases/s: now/{rev} = {now / old:.2f}x "
        f"(spread now {min(rates['now']):.1f}-{max(rates['now']):.1f}, {rev} {min(rates[rev]):.1f}-{max(rates[rev]):.1f}); "
        f"{load_line('at the end')}"
    )


def case_for(layout: simdist.Layout) -> DraftCase:
    seq, rows, micro = 6, 2, 2
    masks = tuple(
        tuple(
            tuple(tuple(1.0 if (r + p + d) % 3 else 0.0 for p in range(seq)) for r in range(rows))
            for _ in range(micro)
        )
        for d in range(layout.dp)
    )
    return DraftCase(
        tp=layout.tp,
        dp=layout.dp,
        pp=layout.pp,
        microbatches=micro,
        seq_len=seq,
        masks=masks,
        vocab_size=8 * layout.tp,
        token_chunk_size=5,
        dtype="float32",
        bin_weights=(1.0, 0.5),
        single_bin=None,
        seed=3,
        reduction="rank",
        reduction_seed=0,
        clip=False,
    )


def _step_args(case: DraftCase):
    return (case, case.config(), case.batches(), ("monolithic", "split"))


def _median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_simdist(case: DraftCase, reps: int) -> float:
    args = _step_args(case)
    return _median_time(lambda: simdist.run(_modes_body, layout=case.layout, args=args), reps)


def time_gloo(case: DraftCase, reps: int) -> tuple[float, float]:
    """(median seconds per case, median seconds of an empty world: start-up and teardown)."""
    layout = case.layout
    simdist.run_processes(_noop, layout=layout, backend="gloo", timeout=300)  # starts the forkserver
    start = _median_time(
        lambda: simdist.run_processes(_noop, layout=layout, backend="gloo", timeout=300), reps
    )
    args = _step_args(case)
    per_case = _median_time(
        lambda: simdist.run_processes(_modes_body, layout=layout, args=args, backend="gloo", timeout=300),
        reps,
    )
    return per_case, start


def gloo_preloaded(reps: int) -> dict[str, list[float]]:
    """``time_gloo`` for every layout, in a subprocess whose forkserver imported the test modules first."""
    # The forkserver imports its preload list with the sys.path it starts
    # with (PYTHONPATH), not the caller's, and skips what it cannot import.
    folders = [ROOT / "tests" / "fuzz", ROOT / "tests" / "support", ROOT]
    try:
        return child_json(__file__, ["--gloo-preloaded-worker", "--reps", reps], path=folders)
    except ChildFailed as exc:
        print(f"   (preloaded gloo worker failed: {exc.stderr[-500:]})")
        return {}


def _gloo_preloaded_worker(reps: int) -> None:
    import multiprocessing
    from multiprocessing import forkserver

    # run_processes sets its own preload list only when it starts the server:
    # started here first, the server keeps this longer list.
    multiprocessing.get_context("forkserver").set_forkserver_preload(BODY_MODULES)
    forkserver.ensure_running()
    print(json.dumps({str(layout): time_gloo(case_for(layout), reps) for layout in LAYOUTS}))


def _noop(ctx) -> None:
    return None


# ------------------------------------------------------------- the breakdown


class _CallMeter:
    """Thread CPU time spent inside torch.distributed's communication calls, per thread.

    Wraps the module's functions (the code under test calls them as
    ``dist.all_reduce(...)``); ``restore`` puts the originals back.
    """

    NAMES = ("all_reduce", "send", "recv", "isend", "irecv", "barrier", "all_gather", "broadcast")

    def __init__(self) -> None:
        self.inside: dict[int, float] = defaultdict(float)
        self.body: dict[int, float] = {}
        self._saved = {name: getattr(dist, name) for name in self.NAMES}
        for name, original in self._saved.items():
            setattr(dist, name, self._wrap(original))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                self.inside[threading.get_ident()] += time.thread_time() - start

        return call

    def restore(self) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)

    def body_fn(self, ctx, *args: Any) -> Any:
        start = time.thread_time()
        try:
            return _modes_body(ctx, *args)
        finally:
            self.body[threading.get_ident()] = time.thread_time() - start


def in_world_split(case: DraftCase, reps: int) -> tuple[float, float, float]:
    """Median (wall, ranks' CPU in the body outside communication calls, ranks' CPU inside them)."""
    args = _step_args(case)
    meter = _CallMeter()
    rows = []
    try:
        for _ in range(reps):
            meter.inside.clear()
            meter.body.clear()
            start = time.perf_counter()
            simdist.run(meter.body_fn, layout=case.layout, args=args)
            wall = time.perf_counter() - start
            calls = sum(meter.inside.values())
            rows.append((wall, sum(meter.body.values()) - calls, calls))
    finally:
        meter.restore()
    return tuple(statistics.median(column) for column in zip(*rows))  # type: ignore[return-value]


class _FakeGroup(dist.ProcessGroup):
    """A group the code under test accepts, for the compute floor (no communication)."""

    def __init__(self, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.fake_rank, self.fake_size = rank, size


def _no_op_all_reduce(
    tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False
) -> None:
    # draft_loss's argument agreement gathers one int64 row per TP rank with a
    # SUM: every rank agreeing with this one keeps valid input valid.
    if tensor.dtype == torch.int64 and tensor.dim() == 2:
        tensor[:] = tensor[group.fake_rank].clone()


def compute_floor(case: DraftCase, reps: int) -> float:
    """Median seconds of every rank's body, run one after another in this thread, collectives as no-ops.

    The values the ranks compute differ from a real run's (nothing is summed
    over ranks); the shapes, the ops and the control flow are those of a
    valid step. Layouts with cp > 1 (which exchange boundary rows with
    isend/irecv) are not supported.
    """
    layout = case.layout
    if layout.cp != 1:
        raise ValueError(f"compute_floor supports cp=1 layouts, got {layout}")
    from draft_loss.cotrain import groups as cotrain_groups

    world = _FakeGroup(0, layout.world_size)
    contexts = []
    for rank in range(layout.world_size):
        coords = layout.coords(rank)
        groups = {
            axis: _FakeGroup(getattr(coords, axis), getattr(layout, axis))
            for axis in ("tp", "cp", "dp", "pp")
        }
        groups["dp_cp"] = _FakeGroup(coords.dp * layout.cp + coords.cp, layout.dp * layout.cp)
        contexts.append(
            SimpleNamespace(rank=rank, layout=layout, coords=coords, groups=SimpleNamespace(**groups))
        )
    fakes = {
        "all_reduce": _no_op_all_reduce,
        "send": lambda tensor, dst=None, group=None, **_: None,
        "recv": lambda tensor, src=None, group=None, **_: None,
        "get_rank": lambda group=None: group.fake_rank,
        "get_world_size": lambda group=None: group.fake_size,
        "get_global_rank": lambda group, rank: rank,
        "get_backend": lambda group=None: "none",
    }
    saved = {name: getattr(dist, name) for name in fakes}
    saved_world = cotrain_groups.world_group
    args = _step_args(case)
    try:
        for name, fake in fakes.items():
            setattr(dist, name, fake)
        cotrain_groups.world_group = lambda: world

        def all_ranks() -> None:
            for ctx in contexts:
                world.fake_rank = ctx.rank
                _modes_body(ctx, *args)

        all_ranks()  # warm-up
        return _median_time(all_ranks, reps)
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)
        cotrain_groups.world_group = saved_world


def _one_case_table(reps: int, no_gloo: bool) -> dict[str, float]:
    """Part 2: one case per layout on simdist and on gloo; gloo's best time per layout."""
    gloo_reps = max(1, reps // 2)
    preloaded = {} if no_gloo else gloo_preloaded(gloo_reps)
    print(
        f"2. one case (monolithic + split step on one world); simdist median of {reps}, gloo of {gloo_reps}"
    )
    print(
        f"   {'layout':<12} {'simdist':>9} {'gloo':>9} {'(start-up)':>10} {'gloo, preloaded':>16} "
        f"{'(start-up)':>10} {'gloo/simdist':>13}"
    )
    nan = float("nan")
    gloo_times: dict[str, float] = {}
    for layout in LAYOUTS:
        case = case_for(layout)
        sim = time_simdist(case, reps)
        gloo, gloo_start = (nan, nan) if no_gloo else time_gloo(case, gloo_reps)
        pre, pre_start = preloaded.get(str(layout), (nan, nan))
        best = min((t for t in (gloo, pre) if t == t), default=nan)
        gloo_times[str(layout)] = best
        print(
            f"   {_name(layout):<12} {sim * 1e3:6.1f} ms {gloo * 1e3:6.0f} ms {gloo_start * 1e3:7.0f} ms "
            f"{pre * 1e3:13.0f} ms {pre_start * 1e3:7.0f} ms {best / sim:12.1f}x"
        )
    return gloo_times


def _split_table(reps: int, gloo_times: dict[str, float]) -> None:
    """Part 3: where a simdist case's time goes, and the floor."""
    print("3. where a simdist case's time goes (medians, ms per case), and the floor")
    print(
        f"   {'layout':<12} {'total':>7} {'world':>7} {'compute':>8} {'in calls':>9} {'calls/rank':>10} "
        f"{'rest':>6} | {'floor':>6} {'best ratio':>10}"
    )
    for layout in LAYOUTS:
        case = case_for(layout)
        wall, compute, in_calls = in_world_split(case, reps)
        world = _median_time(lambda layout=layout: simdist.run(_noop, layout=layout), reps)
        with simdist.CommStats() as stats:
            simdist.run(_modes_body, layout=layout, args=_step_args(case))
        calls = stats.count().calls // layout.world_size
        floor = compute_floor(case, reps)
        best = gloo_times[str(layout)] / (world + floor)
        print(
            f"   {_name(layout):<12} {wall * 1e3:7.1f} {world * 1e3:7.1f} {compute * 1e3:8.1f} {in_calls * 1e3:9.1f} "
            f"{calls:>10} {(wall - world - compute - in_calls) * 1e3:6.1f} | {floor * 1e3:6.1f} {best:9.1f}x"
        )
    print(
        "   world: start + teardown of an empty world; compute: rank threads' CPU in the body outside\n"
        "   torch.distributed calls; in calls: their CPU inside them (simdist's per-call work); rest: total\n"
        "   minus those (handing the run token between threads, the caller's thread, the machine's other\n"
        "   load; each column is a median of its own runs, so noise can push it below 0); floor: every\n"
        "   rank's body in one thread, collectives as no-ops; best ratio: gloo / (world + floor)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads on simdist's side (default 1)"
    )
    parser.add_argument("--no-campaign", action="store_true")
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also run the default campaign as of this git revision (its whole tree), alternating with now",
    )
    parser.add_argument("--rounds", type=int, default=1, help="campaigns per side with --before (default 1)")
    parser.add_argument(
        "--campaign-only", action="store_true", help="only the campaign(s), not parts 2 and 3"
    )
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--gloo-preloaded-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gloo_preloaded_worker:
        _gloo_preloaded_worker(max(1, args.reps // 2))
        return 0
    torch.set_num_threads(args.threads)
    print(
        f"{load_line('at the start')}, torch {torch.__version__}, "
        f"simdist side {torch.get_num_threads()} intra-op thread(s)"
    )
    if args.before:
        campaigns_before_after(args.budget, args.workers, args.before, args.rounds)
    elif not args.no_campaign:
        campaign(args.budget, args.workers)
    if args.campaign_only:
        return 0
    _split_table(args.reps, _one_case_table(args.reps, args.no_gloo))
    return 0


def _name(layout: simdist.Layout) -> str:
    return "-".join(
        f"{axis}{getattr(layout, axis)}" for axis in ("tp", "cp", "dp", "pp") if getattr(layout, axis) > 1
    )


if __name__ == "__main__":
    sys.exit(main())
