"""PyTorch's own distributed tests on simdist and natively, side by side.

    python benchmarks/torch_tests.py                  # every distributed_test test on simdist,
                                                      # the native sample of 8, the sample classes
    python benchmarks/torch_tests.py --native 0       # simdist only
    python benchmarks/torch_tests.py -k all_reduce    # tests whose name contains all_reduce
    python benchmarks/torch_tests.py --native-all     # every test simdist does not skip, natively
                                                      # too (an hour or more on two cores)
    python benchmarks/torch_tests.py --threaded-only  # only the threaded-PG classes, side by side
    python benchmarks/torch_tests.py --threaded-only --calls   # and their Python calls per test

Runs the installed wheel's ``distributed_test.py`` (gloo, world 3, as
PyTorch's ``test_distributed_spawn.py`` builds it) through
``simdist.torch_compat``, each test in a child process that reports test by
test, so a test that crashed the interpreter is named (and the next child
goes on after it) instead of ending the benchmark. A fixed sample of the tests
(``NATIVE_SAMPLE``) runs natively too (spawned gloo processes, 10-35 s a test
on two cores), each with its own ratio and the seconds its body sleeps, and the
threaded-PG and DTensor-style classes of tests/support/torch_harness_cases.py
run both ways. Prints pass counts, what fails on simdist but passes natively,
and time ratios. It asserts nothing.

The threaded-PG classes (``ThreadCases``, a ``MultiThreadedTestCase``, and a
class of ``spawn_threads_and_init_comms`` tests) run side by side in one child
process: each repeat runs the whole class once through simdist (the adapter
installed) and once on torch's threaded process group (uninstalled), in
alternating order, so both see the same load. Printed: the best of
``--repeats`` class runs and the spread (median and slowest over best), the
first run of each (where the child's imports and simdist's thread pool
start), and the load average before and after. A third way runs in the same
alternation: the adapter with its runs under ``schedule="concurrent"``, which
swaps no per-rank state and does not serialise the ranks; it shows what the
rest of simdist costs per test. ``--calls`` counts the Python
function calls (and builtin calls) per test in every thread, simdist's split
by where they run (the adapter, the engine's rooms, torch's harness): counts,
unlike times, do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any

from _harness import alternate, load_line, table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The native sample, fixed: two tests of each kind (collectives, P2P, groups,
# DDP), chosen for what they cover, not for their times. The ratio is total
# native s / total simdist s over these. test_barrier's body sleeps 0.4 s per
# rank in turn (natively too); the sleep column shows such time.
NATIVE_SAMPLE = [
    "test_barrier",  # collectives
    "test_all_gather_object_default_pg",
    "test_send_recv",  # P2P
    "test_batch_isend_irecv_gloo",
    "test_destroy_group",  # groups
    "test_get_rank_size_group",
    "test_DistributedDataParallelCPU",  # DDP
    "test_accumulate_gradients_no_sync_allreduce_hook",
]
# Tests that need one process per rank: reported as known, not as failures
# (docs/pytorch-tests.md, "What differs").
NEEDS_PROCESSES = {"test_get_rank": "names files by os.getpid(), one per rank"}


def _case_classes(world: str) -> dict[str, type]:
    sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
    from simdist import torch_compat

    classes: dict[str, type] = {}
    if world in ("dist", "all"):
        classes["distributed_test"] = torch_compat.distributed_test_class(world_size=3)
    if world in ("cases", "all"):
        import torch_harness_cases as cases

        classes["threaded"] = cases.ThreadCases
        classes["dtensor"] = cases.DTensorCases
    return classes


def child(args: argparse.Namespace) -> None:
    """Run the named tests of one class, appending one JSON line per test."""
    from simdist import torch_compat

    if args.mode == "simdist":
        torch_compat.install()
    slept = _count_sleeps()
    cls = _case_classes("all" if args.cls != "distributed_test" else "dist")[args.cls]
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {json.loads(line)["name"] for line in f if line.strip()}
    for name in args.names:
        if name in done:
            continue
        with open(args.out, "a") as f:
            f.write(json.dumps({"name": name, "verdict": "started"}) + "\n")
        result = unittest.TestResult()
        slept[0] = 0.0
        start = time.perf_counter()
        cls(name).run(result)
        seconds = time.perf_counter() - start
        if result.errors or result.failures:
            verdict, why = "fail", (result.errors + result.failures)[0][1].strip().splitlines()[-1][:160]
        elif result.skipped:
            verdict, why = "skip", result.skipped[0][1][:80]
        else:
            verdict, why = "pass", ""
        with open(args.out, "a") as f:
            record = {"name": name, "verdict": verdict, "s": seconds, "why": why, "sleep": slept[0]}
            f.write(json.dumps(record) + "\n")


def _count_sleeps() -> list[float]:
    """``time.sleep`` seconds asked for in this process (summed over its
    threads): the time a test's own body spends sleeping, where it runs on
    simdist (natively the sleeps are in the spawned processes)."""
    slept = [0.0]
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        slept[0] += seconds
        real_sleep(seconds)

    time.sleep = sleep
    return slept


# -- the threaded-PG classes, side by side in one process ----------------------


def _threaded_pairs() -> dict[str, tuple[type, type]]:
    """Each threaded-PG class as (simdist's, the threaded PG's): a
    ``spawn_threads_and_init_comms`` test is wrapped when its class is
    defined, so that class is defined once with the adapter installed and once
    without; a ``MultiThreadedTestCase`` is routed at run time."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
    import torch_harness_cases as cases

    from simdist import torch_compat

    torch_compat.install()
    decorated_sim = cases.decorated_cases()
    torch_compat.uninstall()
    decorated_native = cases.decorated_cases()
    return {
        "ThreadCases (MultiThreadedTestCase)": (cases.ThreadCases, cases.ThreadCases),
        "spawn_threads_and_init_comms": (decorated_sim, decorated_native),
    }


def _run_class(cls: type, names: list[str]) -> tuple[float, dict[str, str]]:
    """One run of the class's tests: the seconds it took, and each test's verdict."""
    verdicts = {}
    start = time.perf_counter()
    for name in names:
        result = unittest.TestResult()
        cls(name).run(result)
        verdicts[name] = "fail" if result.errors or result.failures else "skip" if result.skipped else "pass"
    return time.perf_counter() - start, verdicts


_RUN: list[Any] = []  # the adapter's simdist.run, as installed (set by the first _in_mode)


def _in_mode(mode: str) -> None:
    """``simdist``: the adapter as users get it. ``concurrent``: the adapter
    with its runs under ``schedule="concurrent"`` (set here, a benchmark's
    instrument, not an option the adapter offers): no per-rank state is
    swapped and ranks are not serialised, so it is the rest of simdist's cost
    per test, what is left with those two taken out. ``threaded``: torch's
    own threaded process group."""
    from simdist import torch_compat

    if not _RUN:
        _RUN.append(torch_compat.simdist_run)
    if mode == "threaded":
        torch_compat.uninstall()
        return
    torch_compat.install()
    run = _RUN[0]
    torch_compat.simdist_run = run if mode == "simdist" else functools.partial(run, schedule="concurrent")


def _class_side_by_side(pair: tuple[type, type], repeats: int) -> dict[str, Any]:
    """One class's runs each way, alternating; the first round (each way's
    first run: imports, simdist's thread pool) reported apart."""
    names = list(unittest.TestLoader().getTestCaseNames(pair[0]))

    def run(mode: str) -> tuple[float, dict[str, str]]:
        _in_mode(mode)
        return _run_class(pair[1] if mode == "threaded" else pair[0], names)

    runs = alternate(["simdist", "threaded", "concurrent"], repeats + 1, run, quiet=True)
    return {
        "n": len(names),
        "first": {mode: got[0][0] for mode, got in runs.items()},
        "times": {mode: [seconds for seconds, _ in got[1:]] for mode, got in runs.items()},
        "verdicts": {mode: got[-1][1] for mode, got in runs.items()},
    }


def side_by_side(repeats: int, out: str) -> None:
    """Child: each threaded-PG class, ``repeats`` times each way, alternating."""
    import logging

    logging.disable(logging.CRITICAL)  # the harness logs every failing rank's traceback
    report: dict[str, dict] = {"load_before": os.getloadavg()[0]}
    for label, pair in _threaded_pairs().items():
        report[label] = _class_side_by_side(pair, repeats)
    _in_mode("threaded")
    report["load_after"] = os.getloadavg()[0]
    with open(out, "w") as f:
        json.dump(report, f)


# Where a call runs, by the file of the code that makes it (a builtin: the
# file that calls it). The first prefix that matches names the room.
_AREAS = [
    ("simdist/torch_compat.py", "simdist: the adapter (torch_compat)"),
    ("simdist/_core/", "simdist: _core (scheduler, turns, pool)"),
    ("simdist/_isolation/", "simdist: _isolation (state swap, patches)"),
    ("simdist/_run/", "simdist: _run (runner, world)"),
    ("simdist/_backend/", "simdist: _backend (process group, ops)"),
    ("simdist/_sanitizer/", "simdist: _sanitizer"),
    ("simdist/", "simdist: other (debug, trace, policy)"),
    ("torch/testing/", "torch's harness (torch.testing._internal)"),
    ("torch/distributed/", "torch.distributed"),
    ("torch/", "torch, other"),
    ("tests/support/", "the test bodies"),
]


def _where(filename: str) -> str:
    """A code object's file, from the package root (``simdist/_core/turns.py``,
    ``torch/...``) or as Python names it (the stdlib's, ``<frozen ...>``)."""
    path = filename.replace(os.sep, "/")
    for prefix, _ in _AREAS:
        top = prefix.split("/")[0] + "/"
        at = path.rfind("/" + top)
        if at >= 0:
            return path[at + 1 :]
    return os.path.basename(path)


def _area(where: str) -> str:
    for prefix, area in _AREAS:
        if where.startswith(prefix):
            return area
    return "Python's stdlib (unittest, threading, traceback)"


def count_calls(repeats: int, out: str) -> None:
    """Child: Python and builtin calls per test in every thread, by the file
    that makes them.

    The counter is installed before any simdist thread exists (parked rank
    threads are reused, so they must start counted), warms every class up
    twice each way, then counts ``repeats`` runs of each class each way."""
    import logging

    logging.disable(logging.CRITICAL)
    counts: dict[str, int] = {}
    counting = [False]
    by_code: dict[Any, str] = {}

    def counter(frame: Any, event: str, arg: Any) -> None:
        if not counting[0] or (event != "call" and event != "c_call"):
            return
        code = frame.f_code  # a builtin is counted where it is called from
        where = by_code.get(code)
        if where is None:
            where = by_code[code] = _where(code.co_filename)
        counts[where] = counts.get(where, 0) + 1

    threading.setprofile(counter)
    sys.setprofile(counter)
    report: dict[str, dict] = {}
    try:
        for label, pair in _threaded_pairs().items():
            names = unittest.TestLoader().getTestCaseNames(pair[0])
            row: dict[str, Any] = {"n": len(names)}
            for mode in ("simdist", "threaded"):
                cls = pair[0] if mode == "simdist" else pair[1]
                _in_mode(mode)
                for _ in range(2):
                    _run_class(cls, names)
                counts.clear()
                counting[0] = True
                for _ in range(repeats):
                    _run_class(cls, names)
                counting[0] = False
                row[mode] = {where: n / (repeats * len(names)) for where, n in counts.items()}
            report[label] = row
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        _in_mode("threaded")
    with open(out, "w") as f:
        json.dump(report, f)


def _child_json(kind: str, repeats: int, timeout: float) -> dict | None:
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, __file__, "--child", kind, "--repeats", str(repeats), "--out", out]
    env = dict(os.environ, PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    try:
        done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=timeout, capture_output=True, check=False)
        with open(out) as f:
            text = f.read()
        if done.returncode != 0 or not text:
            print(f"  the {kind} child failed (exit code {done.returncode}):")
            print("  " + "\n  ".join(done.stderr.decode(errors="replace").strip().splitlines()[-8:]))
            return None
        return json.loads(text)
    except subprocess.TimeoutExpired:
        print(f"  the {kind} child did not finish in {timeout:.0f} s")
        return None
    finally:
        os.unlink(out)


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def print_side_by_side(repeats: int) -> None:
    report = _child_json("side-by-side", repeats, timeout=60 + 20 * repeats)
    if report is None:
        return
    print(
        f"\nthreaded-PG classes, side by side in one process: best of {repeats} class runs each way, "
        f"alternating; load average {report['load_before']:.2f} before, {report['load_after']:.2f} after"
    )
    rows, floors = [], []
    for label, row in report.items():
        if not isinstance(row, dict):
            continue
        cells = []
        for mode in ("simdist", "threaded"):
            times = sorted(row["times"][mode])
            best, median, worst = times[0], times[len(times) // 2], times[-1]
            cells.append(f"{_ms(best)} ({median / best:.2f}x, {worst / best:.2f}x)")
        ratio = min(row["times"]["threaded"]) / min(row["times"]["simdist"])
        same = row["verdicts"]["simdist"] == row["verdicts"]["threaded"]
        shown = ", ".join(f"{n}: {v}" for n, v in sorted(row["verdicts"]["simdist"].items()))
        verdicts = f"same ({shown})" if same else f"DIFFER: {row['verdicts']}"
        first = f"{_ms(row['first']['simdist'])} / {_ms(row['first']['threaded'])}"
        rows.append([label, row["n"], cells[0], cells[1], f"{ratio:.2f}x", first, verdicts])
        concurrent = min(row["times"]["concurrent"])
        ratio = min(row["times"]["threaded"]) / concurrent
        same = row["verdicts"]["concurrent"] == row["verdicts"]["threaded"]
        floors.append([label, _ms(concurrent), f"{ratio:.2f}x", same])
    print()
    headers = ["class", "tests", "simdist best ms (median, slowest)", "threaded PG best ms (median, slowest)"]
    headers += ["threaded PG / simdist, best", "first run ms, simdist / threaded PG", "verdicts"]
    table(headers, rows, markdown=True)
    print(
        "  (median and slowest are over the best; a ratio above 1.00x: simdist faster. The first runs "
        "include what the child does once: imports, simdist's thread pool.)"
    )
    print(
        '\nThe same classes with the adapter\'s runs under schedule="concurrent" (in the same '
        "alternation): no per-rank state swapped, ranks not serialised; what simdist costs per test "
        "without those two.\n"
    )
    table(["class", "best ms", "threaded PG / this, best", "same verdicts"], floors, markdown=True)


def print_calls(repeats: int) -> None:
    report = _child_json("calls", repeats, timeout=120 + 30 * repeats)
    if report is None:
        return
    for label, row in report.items():
        by_area: dict[str, dict[str, float]] = {"simdist": {}, "threaded": {}}
        for mode, areas in by_area.items():
            for where, n in row[mode].items():
                areas[_area(where)] = areas.get(_area(where), 0.0) + n
        sim, native = by_area["simdist"], by_area["threaded"]
        print(
            f"\n{label}: Python and builtin calls per test, every thread ({row['n']} tests, "
            f"{repeats} runs each way)"
        )
        order = sorted(set(sim) | set(native), key=lambda a: -max(sim.get(a, 0), native.get(a, 0)))
        rows = [[area, f"{sim.get(area, 0):.0f}", f"{native.get(area, 0):.0f}"] for area in order]
        rows.append(["all", f"{sum(sim.values()):.0f}", f"{sum(native.values()):.0f}"])
        print()
        table(["where", "simdist", "threaded PG"], rows, markdown=True)
        files = sorted(
            ((n, where) for where, n in row["simdist"].items() if where.startswith("simdist/")), reverse=True
        )
        print(
            "  simdist's files making the most calls per test: "
            + ", ".join(f"{w} {n:.0f}" for n, w in files[:8])
        )


def run_tests(mode: str, cls: str, names: list[str], timeout: float) -> dict[str, dict]:
    """Each test's verdict; a child that dies mid-test marks that test 'crash' and the next child goes on."""
    fd, out = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    env = dict(os.environ, PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    results: dict[str, dict] = {}
    while True:
        left = [n for n in names if n not in results]
        if not left:
            break
        cmd = [sys.executable, __file__, "--child", mode, "--cls", cls, "--out", out, *left]
        try:
            subprocess.run(cmd, env=env, cwd=ROOT, timeout=timeout, capture_output=True, check=False)
        except subprocess.TimeoutExpired:
            pass
        with open(out) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        for line in lines:
            if line["verdict"] != "started":
                results[line["name"]] = line
        stuck = [
            line["name"] for line in lines if line["verdict"] == "started" and line["name"] not in results
        ]
        if not stuck:
            for name in left:  # the child ended without reaching these
                results.setdefault(name, {"name": name, "verdict": "crash", "s": 0.0, "why": "child exited"})
            break
        results[stuck[-1]] = {"name": stuck[-1], "verdict": "crash", "s": 0.0, "why": "process died or hung"}
        with open(out, "a") as f:
            f.write(json.dumps(results[stuck[-1]]) + "\n")
    os.unlink(out)
    return results


def counts(results: dict[str, dict]) -> str:
    by: dict[str, int] = {}
    for r in results.values():
        by[r["verdict"]] = by.get(r["verdict"], 0) + 1
    shown = ", ".join(f"{by.get(v, 0)} {v}" for v in ("pass", "fail", "skip", "crash"))
    return shown + (f", {by['known']} known (needs processes)" if by.get("known") else "")


def seconds(results: dict[str, dict], names: list[str]) -> float:
    return sum(results[n].get("s", 0.0) for n in names if n in results)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--native", type=int, default=len(NATIVE_SAMPLE), help="distributed_test tests run natively too"
    )
    parser.add_argument(
        "--native-all",
        action="store_true",
        help="run natively every distributed_test test that simdist does not skip (the share that "
        "pass on simdist of those that pass natively is then the whole file's)",
    )
    parser.add_argument("-k", default="", help="only distributed_test tests whose name contains this")
    parser.add_argument(
        "--repeats", type=int, default=15, help="class runs each way for the threaded-PG classes (best of)"
    )
    parser.add_argument(
        "--threaded-only", action="store_true", help="only the threaded-PG classes, side by side"
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="also count the threaded-PG classes' Python calls per test, by where they run",
    )
    parser.add_argument(
        "--child", choices=["simdist", "native", "side-by-side", "calls"], help=argparse.SUPPRESS
    )
    parser.add_argument("--cls", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    return args


def _distributed_test_on_simdist(names: list[str]) -> dict[str, dict[str, Any]]:
    """distributed_test.py's ``names`` on simdist, printed with the verdicts that need a word."""
    start = time.perf_counter()
    sim = run_tests("simdist", "distributed_test", names, timeout=3600)
    for name in NEEDS_PROCESSES:
        if name in sim and sim[name]["verdict"] == "fail":
            sim[name]["verdict"] = "known"  # needs processes: a fail known and documented
    wall = time.perf_counter() - start
    print(
        f"\ndistributed_test.py on simdist (gloo, world 3): {len(names)} tests: {counts(sim)}; {wall:.1f} s wall"
    )
    for r in sorted(sim.values(), key=lambda r: r["name"]):
        if r["verdict"] == "known":
            print(f"  known {r['name']}: needs processes ({NEEDS_PROCESSES[r['name']]})")
        elif r["verdict"] in ("fail", "crash"):
            print(f"  {r['verdict']:5} {r['name']}: {r['why']}")
    return sim


def _native_sample(sample: list[str], sim: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The sample run natively, compared test by test with its simdist verdicts and times."""
    native = run_tests("native", "distributed_test", sample, timeout=600 * len(sample))
    print(f"\nnative sample (spawned gloo processes): {len(sample)} tests: {counts(native)}")
    lost = [n for n in sample if native[n]["verdict"] == "pass" and sim[n]["verdict"] != "pass"]
    print(f"  pass natively, not on simdist: {lost or 'none'}")
    gained = [n for n in sample if native[n]["verdict"] != "pass" and sim[n]["verdict"] == "pass"]
    print(f"  pass on simdist, not natively: {gained or 'none'}")
    passing = [n for n in sample if native[n]["verdict"] == "pass"]
    if passing:
        kept = sum(sim[n]["verdict"] == "pass" for n in passing)
        print(
            f"  of the {len(passing)} that pass natively, {kept} pass on simdist "
            f"({100 * kept / len(passing):.0f}%)"
        )
    times = []
    for n in sample:
        s_s, n_s = sim[n].get("s", 0.0), native[n].get("s", 0.0)
        ratio = f"{n_s / s_s:.0f}x" if s_s > 0 else "-"
        times.append([n, f"{s_s:.2f}", f"{sim[n].get('sleep', 0.0):.2f}", f"{n_s:.2f}", ratio])
    print()
    headers = ["test", "simdist s", "of which sleep s", "native s", "native s / simdist s"]
    table(headers, times, markdown=True)
    return native


def main() -> None:
    args = _parse_args()
    if args.child == "side-by-side":
        side_by_side(args.repeats, args.out)
        return
    if args.child == "calls":
        count_calls(args.repeats, args.out)
        return
    if args.child:
        args.mode = args.child
        child(args)
        return

    import torch

    print(f"torch {torch.__version__}, {load_line('at the start')}")
    if args.threaded_only:
        print_side_by_side(args.repeats)
        if args.calls:
            print_calls(3)
        print(f"\n{load_line('at the end')}")
        return
    dist_cls = _case_classes("dist")["distributed_test"]
    names = [n for n in unittest.TestLoader().getTestCaseNames(dist_cls) if args.k in n]
    sim = _distributed_test_on_simdist(names)
    if args.native_all:
        sample = [n for n in names if sim[n]["verdict"] != "skip"]
    else:
        sample = [n for n in NATIVE_SAMPLE if n in names][: args.native]
        sample += [n for n in names if n not in sample and sim[n]["verdict"] == "pass"][
            : max(0, args.native - len(sample))
        ]
    rows = []
    if sample:
        rows.append(("distributed_test sample", sample, sim, _native_sample(sample, sim)))
    for label in ("dtensor",):
        cls = _case_classes("cases")[label]
        cnames = unittest.TestLoader().getTestCaseNames(cls)
        rows.append(
            (
                label,
                cnames,
                run_tests("simdist", label, cnames, 600),
                run_tests("native", label, cnames, 1200),
            )
        )

    summary = []
    for label, tnames, s_res, n_res in rows:
        s_s, n_s = seconds(s_res, tnames), seconds(n_res, tnames)
        ratio = f"{n_s / s_s:.2f}x" if s_s > 0 else "-"
        simdist_cell = f"{counts({n: s_res[n] for n in tnames})}, {s_s:.2f} s"
        summary.append([label, len(tnames), simdist_cell, f"{counts(n_res)}, {n_s:.2f} s", ratio])
    print()
    table(["tests", "n", "simdist", "native", "native s / simdist s"], summary, markdown=True)
    print_side_by_side(args.repeats)
    if args.calls:
        print_calls(3)
    print(f"\n{load_line('at the end')}")


if __name__ == "__main__":
    main()
