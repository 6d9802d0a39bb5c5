"""How simdist scales: start-up, per-call cost against world size, memory per rank.

Prints, side by side and measured in this one run (each figure in a fresh
child process, so one measurement's memory or threads never weigh on the next):

* start-up plus one step (an all_reduce on tp, one on dp, a send/recv between
  pp neighbours) of a 1024-rank Layout(tp=8, dp=16, pp=8) and a 4096-rank
  Layout(tp=8, dp=64, pp=8), results checked against a reference;
* a tp=2 all_reduce's cost in a world of 8 and of 1024 (two ranks call it in a
  loop while every other rank waits in a barrier);
* ``new_group`` called by a non-member, per call, in a world of 8 and of 1024,
  and Megatron-style code where every rank creates every tp, dp and pp group;
* resident memory per idle rank: every rank blocked in a barrier, 1024 or 4096
  ranks against 8;
* a small 8-rank all_reduce on simdist and on PyTorch's threaded test process
  group (torch.testing._internal, used here for comparison only), interleaved;
* the cost of one state swap at a run-token switch (rank_state.RankStates).

``--focus`` prints only the engine's two targets against the threaded PG,
interleaved in one process per world size: an empty world's start plus
teardown at 8 and 64 ranks, and a small all_reduce at 2, 4, 8 and 16 ranks.

``--before REV`` runs the same child measurements on simdist as of git
revision REV too (exported with ``git archive``), for a before/after table;
slow "before" figures are skipped past ``--before-timeout`` seconds.
Timings are noisy on a shared machine: the load average is printed with them.
Prints, never asserts.

    python benchmarks/scale.py
    python benchmarks/scale.py --before 4e83851 --quick
    python benchmarks/scale.py --focus --before main
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import timeit
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _harness import ROOT, ChildFailed, child_json, exported, load_line, table

# --------------------------------------------------------------------------- #
# Child side: one measurement per process, printed as one JSON line.
# --------------------------------------------------------------------------- #


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def step_body(ctx: Any) -> float:
    """One step: all_reduce on tp, then on dp, then even pp stages send to the next."""
    import torch
    import torch.distributed as dist

    t = torch.full((4,), float(ctx.rank))
    dist.all_reduce(t, group=ctx.groups.tp)
    dist.all_reduce(t, group=ctx.groups.dp)
    stage, stages = ctx.coords.pp, ctx.layout.pp
    if stage % 2 == 0 and stage + 1 < stages:
        dist.send(t, group_dst=stage + 1, group=ctx.groups.pp)
    elif stage % 2 == 1:
        dist.recv(t, group_src=stage - 1, group=ctx.groups.pp)
    return float(t[0])


def step_reference(tp: int, dp: int, pp: int) -> list[float]:
    """What ``step_body`` returns per rank, from the Megatron rank formula alone."""

    def rank(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    def reduced(p: int) -> float:  # sum over tp and dp of the ranks of stage p
        return float(sum(rank(t, d, p) for t in range(tp) for d in range(dp)))

    out = [0.0] * (tp * dp * pp)
    for p in range(pp):
        value = reduced(p - 1) if p % 2 == 1 else reduced(p)
        for t in range(tp):
            for d in range(dp):
                out[rank(t, d, p)] = value
    return out


def _timed_layout_run(body: Any, tp: int, dp: int, pp: int) -> tuple[Any, list[Any], float]:
    """Run ``body`` on Layout(tp, dp, pp): (layout, results, seconds, start-up included)."""
    import simdist

    layout = simdist.Layout(tp=tp, dp=dp, pp=pp)
    start = time.perf_counter()
    results = simdist.run(body, layout=layout, timeout=900)
    return layout, results, time.perf_counter() - start


def child_step(tp: int, dp: int, pp: int) -> dict[str, Any]:
    """The first run of the shape in a fresh process, then a second one (what reuse saves)."""
    _, results, seconds = _timed_layout_run(step_body, tp, dp, pp)
    _, again, second = _timed_layout_run(step_body, tp, dp, pp)
    expected = step_reference(tp, dp, pp)
    return {"seconds": seconds, "second": second, "correct": results == expected == again}


def pair_all_reduce_body(ctx: Any, iters: int) -> float | None:
    """Ranks 0 and 1 (one tp group) time ``iters`` all_reduces; the others wait in a barrier."""
    import torch
    import torch.distributed as dist

    seconds = None
    if ctx.rank < 2:
        t = torch.ones(8)
        for _ in range(10):
            dist.all_reduce(t, group=ctx.groups.tp)
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=ctx.groups.tp)
        seconds = (time.perf_counter() - start) / iters
    dist.barrier()
    return seconds


def child_group_size(small: int, large: int, iters: int, repeats: int) -> dict[str, Any]:
    """Both world sizes in one process, interleaved, ``repeats`` times: a
    busy machine's noise (one pair's figure can swing 2x) hits both alike."""
    import simdist

    samples: dict[int, list[float]] = {small: [], large: []}
    for _ in range(repeats):
        for world in (small, large):
            results = simdist.run(
                pair_all_reduce_body, layout=simdist.Layout(tp=2, dp=world // 2), args=(iters,), timeout=900
            )
            samples[world].append(max(r for r in results if r is not None))
    return {
        "small": statistics.median(samples[small]),
        "large": statistics.median(samples[large]),
        "ratios": [b / a for a, b in zip(samples[small], samples[large])],
    }


def new_group_body(ctx: Any, groups: list[list[int]], timed: int) -> float | None:
    """Every rank creates every group in ``groups`` (c10d's default, not local
    synchronisation: each rank calls new_group for every group, in the same
    order); then the last rank, a member of none of them, creates ``timed``
    more alone (no rank depends on those) and returns its seconds per call."""
    import torch.distributed as dist

    for ranks in groups:
        dist.new_group(ranks)
    if ctx.rank != ctx.world_size - 1:
        return None
    start = time.perf_counter()
    for i in range(timed):
        dist.new_group(groups[i % len(groups)])
    return (time.perf_counter() - start) / timed


def child_new_group(world: int, count: int, timed: int) -> dict[str, Any]:
    import simdist

    # Groups among ranks 0..5 only: the last rank is a member of none of them.
    pairs = [[a, b] for a in range(6) for b in range(a + 1, 6)]
    groups = [pairs[i % len(pairs)] for i in range(count)]
    results = simdist.run(new_group_body, world_size=world, args=(groups, timed), timeout=900)
    return {"per_call_non_member": results[-1]}


def megatron_body(ctx: Any) -> int:
    """Every rank creates every tp, dp and pp group, as Megatron's parallel_state does."""
    import torch.distributed as dist

    mine = 0
    for axis in ("tp", "dp", "pp"):
        for ranks in ctx.layout.group_ranks(axis):
            group = dist.new_group(ranks)
            mine += ctx.rank in ranks and dist.get_world_size(group) == len(ranks)
    return mine


def child_megatron(tp: int, dp: int, pp: int) -> dict[str, Any]:
    layout, results, seconds = _timed_layout_run(megatron_body, tp, dp, pp)
    calls = layout.world_size * (
        len(layout.group_ranks("tp")) + len(layout.group_ranks("dp")) + len(layout.group_ranks("pp"))
    )
    return {"seconds": seconds, "calls": calls, "correct": results == [3] * layout.world_size}


def idle_body(ctx: Any) -> int | None:
    """The last rank reads the process's memory while every other rank waits in a barrier."""
    import torch.distributed as dist

    rss = _rss_bytes() if ctx.rank == ctx.world_size - 1 else None
    dist.barrier()
    return rss


def child_rss(tp: int, dp: int, pp: int) -> dict[str, Any]:
    import simdist

    before = _rss_bytes()
    rss = simdist.run(idle_body, layout=simdist.Layout(tp=tp, dp=dp, pp=pp), timeout=900)[-1]
    return {"world": tp * dp * pp, "rss_delta": rss - before}


def _on_threaded_pg(n: int, rank_body: Any) -> None:
    """Run ``rank_body(r)`` on ``n`` threads of torch's threaded test PG, each
    between ``init_process_group`` and ``destroy_process_group``.

    On torch 2.13 it does not initialise by itself (c10d's C++ group-name
    registry is process-wide, so every rank registering group "0" collides):
    thread-isolation mode gives each thread its own registry while it runs."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import _set_thread_isolation_mode
    from torch.testing._internal.distributed import multi_threaded_pg as mtpg

    mtpg._install_threaded_pg()
    _set_thread_isolation_mode(True)
    store = dist.HashStore()
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            dist.init_process_group("threaded", rank=r, world_size=n, store=store)
            rank_body(r)
            dist.destroy_process_group()
        except BaseException as exc:
            errors.append(exc)
            mtpg.ProcessLocalGroup.exception_handle(exc)

    try:
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _set_thread_isolation_mode(False)
        mtpg._uninstall_threaded_pg()
        mtpg.ProcessLocalGroup.reset()
    if errors:
        raise errors[0]


def _threaded_pg_all_reduce(n: int, iters: int) -> float:
    """Seconds per small all_reduce on torch's threaded test PG (slowest rank)."""
    out: list[float] = [0.0] * n

    def body(r: int) -> None:
        out[r] = _time_small_all_reduce(iters)

    _on_threaded_pg(n, body)
    return max(out)


def _time_small_all_reduce(iters: int) -> float:
    """Seconds per all_reduce of 8 floats, after a warm-up and a barrier: the
    same loop on either backend."""
    import torch
    import torch.distributed as dist

    t = torch.ones(8)
    for _ in range(10):
        dist.all_reduce(t)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    return (time.perf_counter() - start) / iters


def small_all_reduce_body(ctx: Any, iters: int) -> float:
    return _time_small_all_reduce(iters)


def child_vs_threaded(n: int, iters: int, repeats: int) -> dict[str, Any]:
    import simdist

    sim, threaded = [], []
    for _ in range(repeats):  # interleaved: load changes hit both columns
        try:
            threaded.append(_threaded_pg_all_reduce(n, iters))
        except Exception as exc:
            return {"error": f"threaded PG failed: {type(exc).__name__}: {exc}"}
        sim.append(max(simdist.run(small_all_reduce_body, world_size=n, args=(iters,))))
    return {
        "simdist": statistics.median(sim),
        "threaded": statistics.median(threaded),
        "ratios": [s / t for s, t in zip(sim, threaded)],
    }


def _threaded_pg_world(n: int) -> float:
    """Seconds to start and tear down an empty ``n``-rank world of torch's
    threaded test PG: threads started, ``init_process_group`` and
    ``destroy_process_group`` in each, threads joined."""
    start = time.perf_counter()
    _on_threaded_pg(n, lambda r: None)
    return time.perf_counter() - start


def empty_body(ctx: Any) -> int:
    return int(ctx.rank)


def child_startup(n: int, repeats: int) -> dict[str, Any]:
    """An empty world's start and teardown, simdist and the threaded PG
    alternating in this one process (after one warm-up world of each)."""
    import simdist

    sim, threaded, sim_cpu, threaded_cpu = [], [], [], []
    try:
        _threaded_pg_world(n)
    except Exception as exc:
        return {"error": f"threaded PG failed: {type(exc).__name__}: {exc}"}
    simdist.run(empty_body, world_size=n)
    for _ in range(repeats):
        cpu = time.process_time()
        threaded.append(_threaded_pg_world(n))
        threaded_cpu.append(time.process_time() - cpu)
        cpu, start = time.process_time(), time.perf_counter()
        simdist.run(empty_body, world_size=n)
        sim.append(time.perf_counter() - start)
        sim_cpu.append(time.process_time() - cpu)
    return {
        "simdist": statistics.median(sim),
        "threaded": statistics.median(threaded),
        "ratios": [s / t for s, t in zip(sim, threaded)],
        # The process's CPU (every thread's): far less disturbed by other load.
        "simdist_cpu": statistics.median(sim_cpu),
        "threaded_cpu": statistics.median(threaded_cpu),
    }


def child_switch() -> dict[str, Any]:
    import random
    import types

    import torch

    from simdist._isolation.rank_state import RankStates

    out: dict[str, Any] = {}
    which = iter(range(10**9))
    states = RankStates(8)
    out["idle"] = timeit.timeit(lambda: states.switch_to(next(which) % 8), number=5000) / 5000
    states.restore_caller()

    def drawing() -> None:  # every rank draws between switches: every state changes
        states.switch_to(next(which) % 8)
        torch.rand(1)
        random.random()

    states = RankStates(8)
    draw_alone = timeit.timeit(lambda: (torch.rand(1), random.random()), number=5000) / 5000
    out["drawing"] = timeit.timeit(drawing, number=5000) / 5000 - draw_alone
    states.restore_caller()

    module = types.ModuleType("scale_bench_globals")
    for i in range(100):
        setattr(module, f"value_{i}", [i])
    states = RankStates(8, rank_local=[module])
    out["module_100_globals"] = timeit.timeit(lambda: states.switch_to(next(which) % 8), number=2000) / 2000
    states.restore_caller()
    return out


CHILDREN = {
    "step": child_step,
    "group_size": child_group_size,
    "new_group": child_new_group,
    "megatron": child_megatron,
    "rss": child_rss,
    "vs_threaded": child_vs_threaded,
    "switch": child_switch,
    "startup": child_startup,
}


# --------------------------------------------------------------------------- #
# Parent side: run each measurement in a fresh process, print tables.
# --------------------------------------------------------------------------- #


def measure(root: Path, kind: str, *args: int, timeout: float) -> dict[str, Any]:
    """Run one child measurement against the simdist found under ``root``."""
    try:
        return child_json(__file__, ["--child", kind, *args], path=[root], timeout=timeout)
    except ChildFailed as exc:
        return {"error": str(exc)}


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def value(result: dict[str, Any], key: str, fmt: Any = fmt_time) -> str:
    if "error" in result:
        return f"({result['error']})"
    return fmt(result[key])


def _vs_threaded_row(label: str, r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [label, f"({r['error']})", "", ""]
    spread = f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}"
    return [
        label,
        fmt_time(r["simdist"]),
        fmt_time(r["threaded"]),
        f"{r['simdist'] / r['threaded']:.2f}x (per pair {spread})",
    ]


def focus(roots: dict[str, Path], limit: dict[str, float], iters: int, repeats: int) -> None:
    """The engine's targets: each figure against the threaded PG measured in
    the same process, alternating; "now" and "before" alternate per world size."""
    headers = ["world, simdist", "simdist", "threaded PG", "simdist / threaded"]
    print(f"\nEmpty world, start + teardown (whole simdist.run), median of {repeats * 3} alternating")
    rows = []
    for n in (8, 64):
        for name, root in roots.items():
            r = measure(root, "startup", n, repeats * 3, timeout=limit[name] + 300)
            row = _vs_threaded_row(f"{n} ranks, {name}", r)
            if "error" not in r:
                row += [
                    fmt_time(r["simdist_cpu"]),
                    fmt_time(r["threaded_cpu"]),
                    f"{r['simdist_cpu'] / r['threaded_cpu']:.2f}x",
                ]
            rows.append(row)
    table(headers + ["simdist CPU", "threaded CPU", "CPU ratio"], rows)
    print(f"\nSmall all_reduce (8 float32) per call, slowest rank, median of {repeats} alternating")
    rows = []
    for n in (2, 4, 8, 16):
        for name, root in roots.items():
            r = measure(root, "vs_threaded", n, iters // 2, repeats, timeout=limit[name] + 300)
            rows.append(_vs_threaded_row(f"{n} ranks, {name}", r))
    table(headers, rows)


def _step_table(roots: dict[str, Path], limit: dict[str, float], sizes: list[tuple[int, int, int]]) -> None:
    print("\nStart-up and one step (tp all_reduce, dp all_reduce, pp send/recv), whole simdist.run")
    rows = []
    for tp, dp, pp in sizes:
        row = [f"{tp * dp * pp} ranks, Layout(tp={tp}, dp={dp}, pp={pp})"]
        for name, root in roots.items():
            if name == "before" and tp * dp * pp > 1024:
                row.append("(not run: quadratic start-up, minutes)")
                continue
            r = measure(root, "step", tp, dp, pp, timeout=limit[name])
            both = f"{value(r, 'seconds')} / {value(r, 'second')}" if "second" in r else value(r, "seconds")
            row.append(both + ("" if r.get("correct", True) else " WRONG RESULTS"))
        rows.append(row)
    table(["world (first run / second run of the shape)"] + list(roots), rows)


def _interleaved_table(
    roots: dict[str, Path],
    limits: dict[str, float],
    child: list[Any],
    columns: tuple[str, str],
    ratio: tuple[str, str],
    headers: list[str],
) -> None:
    """A child that measures two things interleaved: both medians and the ratio
    ``ratio[0] / ratio[1]``, with its spread over the repeats."""
    rows = []
    for name, root in roots.items():
        r = measure(root, *child, timeout=limits[name])
        if "error" in r:
            rows.append([name, f"({r['error']})", "", ""])
        else:
            spread = f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}"
            quotient = r[ratio[0]] / r[ratio[1]]
            cells = [fmt_time(r[columns[0]]), fmt_time(r[columns[1]])]
            rows.append([name, *cells, f"{quotient:.2f}x (per repeat {spread})"])
    table(headers, rows)


def _new_group_tables(roots: dict[str, Path], limit: dict[str, float]) -> None:
    print("\nnew_group called by a rank that is not a member (c10d default: every rank calls it), per call")
    rows = []
    for world in (8, 1024):
        row = [str(world)]
        for name, root in roots.items():
            row.append(
                value(
                    measure(root, "new_group", world, 200, 5000, timeout=limit[name]), "per_call_non_member"
                )
            )
        rows.append(row)
    table(["world"] + list(roots), rows)
    print("\nMegatron-style: every rank creates every tp, dp and pp group (whole simdist.run)")
    rows = []
    for tp, dp, pp in [(2, 2, 2), (8, 16, 8)]:
        row = [f"Layout(tp={tp}, dp={dp}, pp={pp})"]
        for name, root in roots.items():
            r = measure(root, "megatron", tp, dp, pp, timeout=limit[name])
            cell = value(r, "seconds")
            if "error" not in r:
                cell += f" ({r['calls']} calls, {fmt_time(r['seconds'] / r['calls'])}/call)"
                cell += "" if r["correct"] else " WRONG GROUPS"
            row.append(cell)
        rows.append(row)
    table(["layout"] + list(roots), rows)


def _memory_table(roots: dict[str, Path], limit: dict[str, float], sizes: list[tuple[int, int, int]]) -> None:
    print("\nResident memory per idle rank (every rank waiting in a barrier), against 8 ranks")
    rows = []
    base = {n: measure(root, "rss", 2, 2, 2, timeout=limit[n]) for n, root in roots.items()}
    for tp, dp, pp in sizes:
        row = [f"{tp * dp * pp} ranks"]
        for name, root in roots.items():
            if name == "before" and tp * dp * pp > 1024:
                row.append("(not run)")
                continue
            r = measure(root, "rss", tp, dp, pp, timeout=limit[name])
            if "error" in r or "error" in base[name]:
                row.append(f"({r.get('error') or base[name].get('error')})")
            else:
                extra = (r["rss_delta"] - base[name]["rss_delta"]) / (r["world"] - base[name]["world"])
                row.append(f"{extra / 1024:.0f} KiB")
        rows.append(row)
    table(["world"] + list(roots), rows)


def every_table(
    roots: dict[str, Path], limit: dict[str, float], iters: int, repeats: int, no_4096: bool
) -> None:
    """Every figure but ``--focus``'s, a table each, "now" and "before" per row or column."""
    sizes = [(8, 16, 8)] + ([] if no_4096 else [(8, 64, 8)])
    _step_table(roots, limit, sizes)
    print(
        "\nA tp=2 all_reduce per call (ranks 0 and 1 loop; every other rank waits in a barrier), "
        f"median of {repeats} interleaved"
    )
    _interleaved_table(
        roots,
        {n: t * repeats for n, t in limit.items()},
        ["group_size", 8, 1024, iters, repeats],
        ("small", "large"),
        ("large", "small"),
        ["simdist", "world 8", "world 1024", "1024 / 8"],
    )
    _new_group_tables(roots, limit)
    _memory_table(roots, limit, sizes)
    print(
        "\nSmall all_reduce (8 float32) on 8 ranks: simdist vs torch's threaded test PG, "
        f"median of {repeats} interleaved"
    )
    _interleaved_table(
        roots,
        {n: t + 300 for n, t in limit.items()},
        ["vs_threaded", 8, iters // 2, repeats],
        ("simdist", "threaded"),
        ("simdist", "threaded"),
        ["simdist", "simdist", "threaded PG", "simdist / threaded"],
    )
    print("\nOne state swap at a run-token switch (RankStates.switch_to, 8 ranks)")
    rows = []
    for name, root in roots.items():
        r = measure(root, "switch", timeout=limit[name])
        rows.append([name, value(r, "idle"), value(r, "drawing"), value(r, "module_100_globals")])
    table(
        [
            "simdist",
            "no rank draws",
            "every rank draws (torch, random)",
            "+ rank_local module of 100 globals",
        ],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--before", metavar="REV", help="also measure simdist as of this git revision")
    parser.add_argument(
        "--before-timeout",
        type=float,
        default=120.0,
        help="seconds a 'before' measurement may take (default 120)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer iterations and repeats")
    parser.add_argument("--no-4096", action="store_true", help="skip the 4096-rank figures")
    parser.add_argument(
        "--focus",
        action="store_true",
        help="only start+teardown (8, 64 ranks) and small all_reduce (2-16 ranks) against the threaded PG",
    )
    opts = parser.parse_args()
    if opts.child:
        kind, *args = opts.child
        print(json.dumps(CHILDREN[kind](*map(int, args))))
        return

    iters = 200 if opts.quick else 1000
    repeats = 3 if opts.quick else 7
    limit = {"now": 900.0, "before": opts.before_timeout}
    print(f"simdist scale benchmark; {load_line('at the start')}")
    with ExitStack() as stack:
        roots = {"now": ROOT}
        if opts.before:
            roots["before"] = stack.enter_context(exported(opts.before, "simdist"))
        if opts.focus:
            focus(roots, limit, iters, repeats)
        else:
            every_table(roots, limit, iters, repeats, opts.no_4096)
    print(f"\n{load_line('at the end')}")


if __name__ == "__main__":
    main()
