"""PyTorch's own distributed tests on simdist and natively, side by side.

    python benchmarks/torch_tests.py                  # every distributed_test test on simdist,
                                                      # the native sample of 8, the sample classes
    python benchmarks/torch_tests.py --native 0       # simdist only
    python benchmarks/torch_tests.py -k all_reduce    # tests whose name contains all_reduce
    python benchmarks/torch_tests.py --native-all     # every test simdist does not skip, natively
                                                      # too (an hour or more on two cores)

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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

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


def main() -> None:
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
    parser.add_argument("--child", choices=["simdist", "native"], help=argparse.SUPPRESS)
    parser.add_argument("--cls", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        child(args)
        return

    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    dist_cls = _case_classes("dist")["distributed_test"]
    names = [n for n in unittest.TestLoader().getTestCaseNames(dist_cls) if args.k in n]
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

    if args.native_all:
        sample = [n for n in names if sim[n]["verdict"] != "skip"]
    else:
        sample = [n for n in NATIVE_SAMPLE if n in names][: args.native]
        sample += [n for n in names if n not in sample and sim[n]["verdict"] == "pass"][
            : max(0, args.native - len(sample))
        ]
    rows = []
    if sample:
        native = run_tests("native", "distributed_test", sample, timeout=600 * len(sample))
        rows.append(("distributed_test sample", sample, sim, native))
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
        print("\n| test | simdist s | of which sleep s | native s | native s / simdist s |")
        print("|---|---|---|---|---|")
        for n in sample:
            s_s, n_s = sim[n].get("s", 0.0), native[n].get("s", 0.0)
            ratio = f"{n_s / s_s:.0f}x" if s_s > 0 else "-"
            print(f"| {n} | {s_s:.2f} | {sim[n].get('sleep', 0.0):.2f} | {n_s:.2f} | {ratio} |")
    for label in ("threaded", "dtensor"):
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

    print("\n| tests | n | simdist | native | native s / simdist s |")
    print("|---|---|---|---|---|")
    for label, tnames, s_res, n_res in rows:
        s_s, n_s = seconds(s_res, tnames), seconds(n_res, tnames)
        ratio = f"{n_s / s_s:.2f}x" if s_s > 0 else "-"
        print(
            f"| {label} | {len(tnames)} | {counts({n: s_res[n] for n in tnames})}, {s_s:.2f} s "
            f"| {counts(n_res)}, {n_s:.2f} s | {ratio} |"
        )
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
