"""PyTorch's wider distributed test files, unchanged, on simdist and natively.

    python benchmarks/pytorch_suites.py --src PYTORCH_CHECKOUT
    python benchmarks/pytorch_suites.py --src PYTORCH_CHECKOUT --native all   # every test natively too
    python benchmarks/pytorch_suites.py --src PYTORCH_CHECKOUT --native 0     # simdist only
    python benchmarks/pytorch_suites.py --src PYTORCH_CHECKOUT --files test/distributed/test_c10d_gloo.py

``--src`` is a PyTorch source tree (or any folder holding its ``test/``
files at their paths) of the release the installed torch was built from:
the test files change with the harnesses in ``torch.testing._internal``,
so another release's files fail for reasons of their own. simdist ships
none of them.

Each file runs in its own pytest process with ``-p simdist.torch_compat``
(the sanitizer in its default state, on), results written test by test by
the ``_outcomes`` plugin, so a crash or a stall names its test and the rest
of the file goes on in a fresh process. Natively (``--native N``, default
12 a file) the file's tests run in spawned gloo processes as PyTorch's CI
runs them: every test that does not pass on simdist, plus N tests spread
evenly over the ones that do (they show that passing on simdist means
passing natively). ``--native all`` runs every test both ways (hours on two
cores). Printed: a table a file (tests, simdist pass/fail/skip, how many
ran natively and passed), the share of natively-passing tests that pass on
simdist, and every difference with the failing test's last error line. It
asserts nothing; ``--json`` keeps the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _harness import load_line, table

HERE = Path(__file__).resolve().parent

FILES = (
    "test/distributed/test_c10d_gloo.py",
    "test/distributed/test_c10d_common.py",
    "test/distributed/test_c10d_object_collectives.py",
    "test/distributed/tensor/parallel/test_tp_examples.py",
    "test/distributed/tensor/parallel/test_tp_style.py",
    "test/distributed/tensor/parallel/test_parallelize_api.py",
    "test/distributed/tensor/parallel/test_tp_random_state.py",
    "test/distributed/pipelining/test_schedule_multiproc.py",
    "test/distributed/pipelining/test_stage.py",
    "test/distributed/pipelining/test_backward.py",
    "test/distributed/tensor/test_dtensor.py",
    "test/distributed/tensor/test_dtensor_compile.py",
)
# FSDP2's files are taken as the checkout has them (most of their tests need CUDA).
FSDP_GLOB = "test/distributed/_composable/fsdp/test_fully_shard_*.py"

PASSING = ("passed", "xfailed")


@dataclass
class Result:
    outcome: str  # passed, failed, error, skipped, xfailed, xpassed, crashed, stalled
    seconds: float = 0.0
    message: str = ""


@dataclass
class FileRun:
    path: str
    tests: list[str] = field(default_factory=list)
    simdist: dict[str, Result] = field(default_factory=dict)
    native: dict[str, Result] = field(default_factory=dict)
    simdist_wall: float = 0.0
    native_wall: float = 0.0


def _env(src: Path, test_file: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The test folder's own helpers (``from test_c10d_common import ...``,
    # ``from model_registry import ...``) are imported by bare name.
    paths = [str(HERE), str(test_file.parent), str(src / "test"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


_INI = Path(tempfile.mkdtemp(prefix="pytorch-suites-")) / "pytest.ini"
_INI.write_text("[pytest]\n", encoding="utf-8")


def _pytest(simdist: bool, folder: Path) -> list[str]:
    # The test's own folder as rootdir and an empty configuration: node ids
    # stay file-relative, and a checkout's pytest.ini changes nothing.
    cmd = [sys.executable, "-m", "pytest", "-q", "-c", str(_INI), "--rootdir", str(folder)]
    cmd += ["-p", "no:cacheprovider", "-p", "_outcomes", "-p", "_removed_names"]
    if simdist:
        cmd += ["-p", "simdist.torch_compat"]
    return cmd


def collect(src: Path, rel: str) -> list[str]:
    test_file = src / rel
    proc = subprocess.run(
        [*_pytest(True, test_file.parent), "--collect-only", str(test_file)],
        cwd=test_file.parent,
        env=_env(src, test_file),
        capture_output=True,
        text=True,
        timeout=900,
    )
    ids = [line.strip() for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if not ids:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        print(f"  {rel}: nothing collected (rc {proc.returncode}): {' | '.join(tail)}", flush=True)
    return ids


def _fold(lines: list[dict[str, object]]) -> tuple[dict[str, Result], str | None]:
    """Per test, one outcome from its phases; and the test that started
    and never finished (the process died or was stopped inside it)."""
    results: dict[str, Result] = {}
    started: str | None = None
    for rec in lines:
        if "start" in rec:
            started = str(rec["start"])
            continue
        nodeid, when, outcome = str(rec["nodeid"]), str(rec["when"]), str(rec["outcome"])
        seconds = float(rec["duration"])  # type: ignore[arg-type]
        res = results.setdefault(nodeid, Result("passed"))
        res.seconds += seconds
        if outcome == "failed":
            if res.outcome not in ("failed", "error"):
                res.outcome = "failed" if when == "call" else "error"
                res.message = str(rec["message"])
        elif outcome in ("skipped", "xfailed", "xpassed") and res.outcome == "passed":
            res.outcome, res.message = outcome, str(rec["message"])
        if when == "teardown" and started == nodeid:
            started = None
    return results, started


def run_tests(
    src: Path, rel: str, ids: Sequence[str], *, simdist: bool, stall: float
) -> tuple[dict[str, Result], float]:
    """Run ``ids`` of one file in as few pytest processes as it takes: a
    process that dies or stalls (no test finished for ``stall`` seconds)
    marks its test and the rest go on in a new one."""
    test_file = src / rel
    results: dict[str, Result] = {}
    left = list(ids)
    wall = 0.0
    while left:
        with tempfile.NamedTemporaryFile("w+", suffix=".jsonl", delete=False) as fh:
            log = Path(fh.name)
        env = _env(src, test_file)
        env["SIMDIST_OUTCOMES"] = str(log)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [
                *_pytest(simdist, test_file.parent),
                *[str(test_file.parent / i) if "::" in i else i for i in left],
            ],
            cwd=test_file.parent,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        last_size, last_change, stalled = -1, time.monotonic(), False
        while proc.poll() is None:
            time.sleep(0.5)
            size = log.stat().st_size
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > stall:
                stalled = True
                os.killpg(proc.pid, 9)
                proc.wait()
        wall += time.perf_counter() - t0
        lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        log.unlink()
        got, unfinished = _fold(lines)
        results.update(got)
        if unfinished is not None:
            results[unfinished] = Result(
                "stalled" if stalled else "crashed",
                message=f"no result after {stall:.0f} s"
                if stalled
                else f"the process ended (rc {proc.returncode})",
            )
        before = len(left)
        left = [i for i in left if i not in results]
        if len(left) == before:  # nothing reached: the process never started a test
            for i in left:
                results[i] = Result("crashed", message=f"pytest ended before the test (rc {proc.returncode})")
            break
    return results, wall


# A skip for hardware this machine lacks holds natively too: not rerun there
# unless --native-skips says so.
_HARDWARE = re.compile(r"cuda|gpu|nccl|accelerator|xpu|hpu|mps", re.IGNORECASE)


def native_choice(run: FileRun, sample: int | None, skips: bool = False) -> list[str]:
    """Every test simdist did not pass (but those skipped for hardware, unless
    ``skips``), and ``sample`` of those it did, spread evenly (all of them
    when ``sample`` is None)."""
    passed = [t for t in run.tests if run.simdist[t].outcome in PASSING]
    if sample is None or sample >= len(passed):
        chosen = set(passed)
    elif sample <= 0:
        chosen = set()
    else:
        step = len(passed) / sample
        chosen = {passed[int(k * step)] for k in range(sample)}
    others = [
        t
        for t in run.tests
        if run.simdist[t].outcome not in PASSING
        and (skips or run.simdist[t].outcome != "skipped" or not _HARDWARE.search(run.simdist[t].message))
    ]
    if sample is not None and sample <= 0:
        return []
    return [t for t in run.tests if t in chosen or t in others]


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def report(runs: list[FileRun]) -> dict[str, object]:
    print()
    rows: list[list[object]] = []
    totals = {"native_pass": 0, "both_pass": 0, "lost": 0}
    differences: list[tuple[str, str, Result, Result]] = []
    unconfirmed = 0
    for run in runs:
        sd = [run.simdist[t] for t in run.tests]
        sd_pass = sum(r.outcome in PASSING for r in sd)
        sd_skip = sum(r.outcome == "skipped" for r in sd)
        sd_fail = len(sd) - sd_pass - sd_skip
        nat_pass = sum(r.outcome in PASSING for r in run.native.values())
        lost = 0
        for t in run.tests:
            s, n = run.simdist[t], run.native.get(t)
            if s.outcome in PASSING:
                if n is not None and n.outcome not in PASSING:
                    unconfirmed += 1  # passes here, not natively: not counted either way
                    continue
                totals["both_pass"] += 1
                totals["native_pass"] += 1
            elif n is not None and n.outcome in PASSING:
                lost += 1
                totals["native_pass"] += 1
                differences.append((run.path, t, s, n))
        totals["lost"] += lost
        name = run.path.replace("test/distributed/", "")
        rows.append([name, len(sd), sd_pass, sd_fail, sd_skip, len(run.native), nat_pass, lost])
    headers = ["file", "tests", "sd pass", "sd fail", "sd skip", "nat run", "nat pass", "lost"]
    table(headers, rows, align="<>")
    share = totals["both_pass"] / totals["native_pass"] if totals["native_pass"] else 0.0
    print()
    print(
        f"natively passing: {totals['native_pass']} (tests passing on simdist and not run natively are "
        f"counted as passing natively; the native runs above check that on a sample)"
    )
    print(f"passing on simdist too: {totals['both_pass']} = {100 * share:.1f}%")
    if unconfirmed:
        print(f"passing on simdist but not natively (counted neither way): {unconfirmed}")
    for run in runs:
        for t in run.tests:
            s, n = run.simdist[t], run.native.get(t)
            if s.outcome in PASSING and n is not None and n.outcome not in PASSING:
                print(f"  native {n.outcome}: {_short(t)}: {n.message[:200]}")
    if differences:
        print("\nnatively passing, not on simdist:")
        for path, t, s, _ in differences:
            print(f"  {path.rsplit('/', 1)[-1]}::{_short(t)}: {s.outcome}: {s.message[:300]}")
    return {"totals": totals, "share": share}


def _gate(runs: list[FileRun], share: float, require: float) -> int:
    """The nightly job's gate: 1 when a test crashed or stalled on simdist, or the share is short."""
    broken = [
        f"{r.path}::{_short(t)}: {r.simdist[t].outcome}"
        for r in runs
        for t in r.tests
        if r.simdist[t].outcome in ("crashed", "stalled")
    ]
    if broken or share < require:
        print(f"\nFAILED the gate: share {100 * share:.1f}% (required {100 * require:.1f}%)")
        for line in broken:
            print(f"  {line}")
        return 1
    return 0


def _run_file(src: Path, rel: str, args: argparse.Namespace, sample: int | None) -> FileRun:
    """One file on simdist, then its native choice, with a line of figures printed."""
    run = FileRun(rel)
    run.tests = [t for t in collect(src, rel) if not args.keyword or args.keyword in t]
    run.simdist, run.simdist_wall = run_tests(src, rel, run.tests, simdist=True, stall=args.stall)
    for t in run.tests:  # a test pytest collected but never reported (deselected by its own hooks)
        run.simdist.setdefault(t, Result("skipped", message="not reported"))
    chosen = native_choice(run, sample, args.native_skips)
    if chosen:
        run.native, run.native_wall = run_tests(src, rel, chosen, simdist=False, stall=args.stall)
    sd_time = sum(run.simdist[t].seconds for t in chosen if t in run.native)
    nat_time = sum(r.seconds for r in run.native.values())
    ratio = (
        f", those tests {nat_time:.1f} s natively / {sd_time:.1f} s on simdist ({nat_time / sd_time:.0f}x)"
        if chosen and sd_time > 0
        else ""
    )
    print(
        f"{rel}: {len(run.tests)} tests, simdist {run.simdist_wall:.0f} s; "
        f"{len(run.native)} natively in {run.native_wall:.0f} s{ratio}",
        flush=True,
    )
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--src", type=Path, required=True, help="a PyTorch checkout of the installed release")
    parser.add_argument("--files", default=None, help="comma-separated paths under --src (default: the list)")
    parser.add_argument(
        "--native", default="12", help="tests a file run natively beyond simdist's non-passes: N, 'all' or 0"
    )
    parser.add_argument(
        "--native-skips", action="store_true", help="run natively too the tests simdist skips for CUDA/GPU"
    )
    parser.add_argument("-k", dest="keyword", default=None, help="only tests whose id contains this")
    parser.add_argument(
        "--stall", type=float, default=900.0, help="seconds without a finished test before a run is stopped"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument(
        "--require",
        type=float,
        default=None,
        help="exit 1 below this share of natively-passing tests passing on simdist (0..1), "
        "or when a test crashed or stalled on simdist (the nightly job's gate)",
    )
    args = parser.parse_args(argv)

    import torch

    src = args.src.resolve()
    if args.files:
        files = [f.strip() for f in args.files.split(",") if f.strip()]
    else:
        files = [*FILES, *sorted(str(p.relative_to(src)) for p in src.glob(FSDP_GLOB))]
    missing = [f for f in files if not (src / f).is_file()]
    if missing:
        parser.error(f"--src {args.src} lacks {', '.join(missing)}")
    sample = None if args.native == "all" else int(args.native)
    print(f"torch {torch.__version__}, {load_line('at the start')}")
    runs = [_run_file(src, rel, args, sample) for rel in files]
    summary = report(runs)
    print(f"\n{load_line('at the end')}")
    if args.json:
        data = {
            "torch": torch.__version__,
            "summary": summary,
            "files": {
                r.path: {
                    t: {
                        "simdist": vars(r.simdist[t]),
                        "native": vars(r.native[t]) if t in r.native else None,
                    }
                    for t in r.tests
                }
                for r in runs
            },
        }
        args.json.write_text(json.dumps(data, indent=1), encoding="utf-8")
    if args.require is not None:
        return _gate(runs, float(summary["share"]), args.require)  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
