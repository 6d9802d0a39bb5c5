"""A helper thread simdist cannot stop (blocked in C) must not hang the test
process: not ``run`` (bounded by the watchdog), and not the interpreter's exit,
which waits for non-daemon threads and for every ThreadPoolExecutor worker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROGRAM = textwrap.dedent("""
    import concurrent.futures, threading, simdist
    never = threading.Event()

    def body(ctx, how):
        if how == "pool":
            pool = concurrent.futures.ThreadPoolExecutor(1)
            pool.submit(never.wait)
        else:
            threading.Thread(target=never.wait, name="stuck-helper").start()
        if how != "returns":
            raise ValueError("the rank's own failure")

    try:
        simdist.run(body, world_size=1, args=(HOW,), timeout=3)
    except Exception as exc:
        print("raised", type(exc).__name__, repr(exc.__cause__))
        print("notes", getattr(exc.__cause__, "__notes__", None))
        print(str(exc))
    print("run returned; exiting")
""")


def _run(how: str) -> subprocess.CompletedProcess[str]:
    # The subprocess timeout only guards this test run from the hang under test.
    return subprocess.run(
        [sys.executable, "-c", _PROGRAM.replace("HOW", repr(how))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_failing_rank_with_a_stuck_helper_reports_its_own_error_and_the_process_exits() -> None:
    proc = _run("raises")
    assert proc.returncode == 0, proc.stderr
    assert 'raised RankError ValueError("the rank\'s own failure")' in proc.stdout, proc.stdout
    # The helper it could not stop is named on the rank's failure, not lost.
    assert "could not be stopped" in proc.stdout and "stuck-helper" in proc.stdout
    assert "run returned; exiting" in proc.stdout


def test_a_stuck_pool_worker_does_not_hang_the_interpreters_exit() -> None:
    proc = _run("pool")
    assert proc.returncode == 0, proc.stderr
    assert "raised RankError ValueError" in proc.stdout and "could not be stopped" in proc.stdout
    assert "run returned; exiting" in proc.stdout


def test_a_returning_rank_waiting_for_its_stuck_helper_times_out_and_the_process_exits() -> None:
    proc = _run("returns")
    assert proc.returncode == 0, proc.stderr
    assert "raised SimulationTimeout" in proc.stdout, proc.stdout
    assert "run returned; exiting" in proc.stdout
