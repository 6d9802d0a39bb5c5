"""Debugging a failing rank: real pdb sessions driven through a pipe (issue 20).

Each session is a pytest (or python, or ``simdist replay``) subprocess whose
stdin is a short script of debugger commands; every one is bounded by a
timeout, and a debugger that reads end-of-file quits, so none can hang.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist import debug

ROOT = Path(__file__).resolve().parents[2]
TARGETS = "tests/debug/targets/failing_ranks.py"
_TIMEOUT = 180.0


def session(
    commands: str, *args: str, env: dict[str, str] | None = None, timeout: float = _TIMEOUT
) -> subprocess.CompletedProcess:
    """``printf COMMANDS | python -m pytest ARGS`` in the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=ROOT,
        input=commands,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def target(name: str) -> str:
    return f"{TARGETS}::{name}"


def out_of(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


# -- 1: post-mortem in the failing rank's own frame ---------------------------


def test_pytest_pdb_opens_in_the_failing_ranks_frame_with_its_locals():
    proc = session("p local_value\np ctx.rank\nranks\nc\n", "--pdb", target("test_rank1_disagrees"))
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert (
        "simdist post-mortem: rank 1 (rank 1 of 2) failed: AssertionError: planted: rank 1 expects 4" in out
    )
    # The prompt names the rank; the frame is the rank's own: its locals print.
    assert "(Pdb rank 1 of 2) tensor([3.])" in out
    assert "(Pdb rank 1 of 2) 1\n" in out
    # Every rank's state: rank 0 frozen (ready, but rank 1 holds the run token), rank 1 failing.
    assert "rank 0 (rank 0 of 2): runnable" in out
    assert "rank 1 (rank 1 of 2): failed with AssertionError: planted: rank 1 expects 4" in out
    # pytest's own post-mortem (in pluggy's frames) did not open after ours.
    assert "_hookexec" not in out and out.count("(Pdb") == 4  # one prompt per command
    assert "1 failed" in out


def test_the_prompt_names_the_coordinates_and_shows_another_ranks_frame():
    commands = "p local_value\nrank 0\np local_value\np ctx.rank\nrank\np ctx.rank\nc\n"
    proc = session(commands, "--pdb", target("test_layout_rank3_fails"))
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert "(Pdb rank 3: tp=1 cp=0 dp=1 pp=0) 300" in out
    # rank 0 is parked in its barrier: its frame, its locals.
    assert "(Pdb rank 0: tp=0 cp=0 dp=0 pp=0) 0\n" in out
    assert "-> dist.barrier()" in out
    # "rank" alone goes back to the failing rank.
    assert "(Pdb rank 3: tp=1 cp=0 dp=1 pp=0) 3\n" in out


def test_a_run_called_by_a_test_opens_in_its_body():
    proc = session("p local_value\nc\n", "--pdb", target("test_run_in_a_test"))
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert "(Pdb rank 1 of 2) 'value of rank 1'" in out
    assert "_hookexec" not in out and "1 failed" in out


def test_a_deadlock_opens_in_the_first_rank_of_the_report_in_the_call():
    proc = session("p ctx.rank\nranks\nc\n", "--pdb", target("test_deadlock"))
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert "failed: DeadlockError" in out
    assert (
        "showing rank 0 (rank 0 of 2), the first rank of the report, in the frame that made the call" in out
    )
    assert "-> dist.all_reduce(t)" in out
    assert "(Pdb rank 0 of 2) 0\n" in out
    assert "DeadlockError: deadlock" in out.split("FAILURES")[-1]  # the run's outcome, as without --pdb


def test_a_mismatch_opens_in_the_first_rank_of_the_report():
    proc = session("p ctx.rank\nc\n", "--pdb", target("test_mismatch"))
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert "failed: CollectiveMismatchError" in out
    assert "-> dist.all_reduce(t)" in out and "(Pdb rank 0 of 2) 0\n" in out


@pytest.mark.parametrize("commands", ["q\n", "", "rank 0\nq\n"], ids=["quit", "eof", "look-then-quit"])
def test_quitting_a_post_mortem_ends_the_session_as_pytest_quits_no_thread_left(commands):
    proc = session(commands, "--pdb", target("test_rank1_disagrees"), target("test_zz_no_thread_left"))
    out = out_of(proc)
    assert "1 failed" in out, out
    if commands.endswith("q\n"):
        assert "Quitting debugger" in out  # the session ends, as pytest's own quit does
        assert "THREADS LEFT" not in out
    assert proc.returncode != 0


def test_continuing_runs_the_remaining_tests_with_no_thread_left():
    proc = session("c\n", "--pdb", "-s", target("test_rank1_disagrees"), target("test_zz_no_thread_left"))
    out = out_of(proc)
    assert "1 failed, 1 passed" in out, out
    assert "THREADS LEFT: []" in out


def test_post_mortem_in_run_and_its_quit(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import threading, torch, torch.distributed as dist, simdist

            def body(ctx):
                mine = torch.full((2,), float(ctx.rank))
                dist.all_reduce(mine)
                assert ctx.rank == 0, "planted"

            try:
                simdist.run(body, world_size=3, post_mortem=True)
            except simdist.RankError as e:
                print("RUN:", type(e.__cause__).__name__, e.failures.keys() if hasattr(e, "failures") else "")
            print("LEFT:", [t.name for t in threading.enumerate() if t is not threading.main_thread()])
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], input="p mine\nq\n", capture_output=True, text=True, timeout=_TIMEOUT
    )
    out = out_of(proc)
    assert proc.returncode == 0, out
    # Rank 2 completes the all_reduce and keeps the run token: it fails first.
    assert "simdist post-mortem: rank 2 (rank 2 of 3) failed: AssertionError: planted" in out
    assert "(Pdb rank 2 of 3) tensor([3., 3.])" in out
    assert "RUN: AssertionError" in out and "LEFT: []" in out
    assert out.count("simdist post-mortem") == 1  # rank 1 fails the same way: no second debugger


# -- 2: the paused world ------------------------------------------------------


def test_a_post_mortem_held_past_the_timeout_does_not_time_out():
    commands = "import time; time.sleep(3)\np ctx.rank\nc\n"
    proc = session(commands, "--pdb", "--simdist-timeout", "1", target("test_rank1_disagrees"))
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert "(Pdb rank 1 of 2) 1\n" in out
    assert "RankFailed: rank 1 of 2 failed: AssertionError" in out
    assert "SimulationTimeout" not in out and "watchdog:" not in out


def test_breakpoint_in_a_rank_pauses_the_world_and_names_the_rank():
    commands = "p local_value\nranks\nimport time; time.sleep(3)\nc\n"
    proc = session(commands, "--simdist-timeout", "1", target("test_breakpoint_in_rank0"))
    out = out_of(proc)
    # The run passes: nothing timed out while rank 0 sat at its prompt.
    assert proc.returncode == 0 and "1 passed" in out, out
    assert "(Pdb rank 0 of 2) 'at the breakpoint'" in out
    assert "rank 0 (rank 0 of 2): at the debugger prompt" in out
    assert "rank 1 (rank 1 of 2): runnable" in out


def test_quitting_a_breakpoint_ends_the_session_with_no_thread_left():
    proc = session("q\n", target("test_breakpoint_in_rank0"), target("test_zz_no_thread_left"))
    out = out_of(proc)
    assert "Quitting debugger" in out, out
    assert proc.returncode != 0


# -- 4: break_at --------------------------------------------------------------


def test_break_at_stops_one_call_before_a_planted_failure():
    commands = "p step, x\nranks\ntail 1\nn\np x\nc\n"
    proc = session(commands, target("test_break_before_planted"))
    out = out_of(proc)
    assert "rank 1 (rank 1 of 2) stops just before rank 1's call #3 matching op=all_reduce" in out, out
    # Stopped in the program's frame before the third all_reduce: two have completed.
    assert "(Pdb rank 1 of 2) (2, tensor([4.]))" in out
    assert (
        "rank 0 (rank 0 of 2): waiting in all_reduce on world [0, 1] seq 2; still missing rank(s) [1]" in out
    )
    tail = out.split("last calls per rank (flight recorder):\n  rank 1:")[1].split("(Pdb")[0]
    assert "all_reduce on world [0, 1] seq 1" in tail and "seq 2" not in tail
    # "n" steps over the call: x is now the third sum.
    assert "(Pdb rank 1 of 2) tensor([8.])" in out
    assert "planted failure at step 2" in out and "1 failed" in out


def test_break_at_quit_ends_the_session_with_no_thread_left():
    proc = session("q\n", target("test_break_before_planted"), target("test_zz_no_thread_left"))
    out = out_of(proc)
    assert "Quitting debugger" in out and "1 failed" in out, out


def test_break_at_in_run_and_when_it_is_never_reached(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import warnings, torch, torch.distributed as dist, simdist

            def body(ctx):
                x = torch.ones(1)
                for i in range(2):
                    dist.broadcast(x, src=0)
                return x.item()

            print("RESULT", simdist.run(body, world_size=2, break_at={"rank": 0, "op": "broadcast", "nth": 2}))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                simdist.run(body, world_size=2, break_at="rank=1,op=broadcast,nth=5")
            print("WARNED", [str(w.message) for w in caught])
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], input="p i\nc\n", capture_output=True, text=True, timeout=_TIMEOUT
    )
    out = out_of(proc)
    assert proc.returncode == 0, out
    assert "(Pdb rank 0 of 2) 1\n" in out and "RESULT [1.0, 1.0]" in out
    assert "break_at never stopped: rank 1's call #5 matching op=broadcast was not reached" in out
    assert "made 2 matching call(s)" in out


@pytest.mark.parametrize(
    ("break_at", "error", "words"),
    [
        (
            {"rank": 1, "opp": "all_reduce"},
            ValueError,
            "unknown key(s) opp; expected rank, op, nth, seq, group",
        ),
        ({"op": "all_reduce"}, ValueError, "break_at needs 'rank'"),
        (
            {"rank": 2},
            ValueError,
            "rank must be a rank of the world (0 or more below the world size 2), got 2",
        ),
        ({"rank": True}, TypeError, "rank must be an int, got bool True"),
        ({"rank": 0, "op": "allreduce"}, ValueError, "op 'allreduce' is not a call simdist records"),
        ({"rank": 0, "nth": 0}, ValueError, "nth counts calls from 1, got 0"),
        ({"rank": 0, "seq": -1}, ValueError, "seq is a group's sequence number (0 or more), got -1"),
        ({"rank": 0, "op": "send", "seq": 1}, ValueError, "point-to-point calls (send/recv) have none"),
        ("rank=1,op", ValueError, "expected KEY=VALUE items such as rank=1,seq=5; got 'op'"),
        ("rank=one", TypeError, "rank must be an int, got str 'one'"),
        ([1, 3], TypeError, "break_at must be a dict"),
    ],
)
def test_bad_break_at_is_refused_before_any_rank_starts(break_at, error, words):
    started = []

    def body(ctx):
        started.append(ctx.rank)

    with pytest.raises(error) as info:
        simdist.run(body, world_size=2, break_at=break_at)
    assert words in str(info.value)
    assert started == []


def test_bad_break_at_on_the_marker_fails_collection(tmp_path):
    test = tmp_path / "test_typo.py"
    test.write_text(
        "import pytest\n\n"
        "@pytest.mark.simdist(world_size=2, break_at={'rank': 0, 'op': 'allreduce'})\n"
        "def test_x(ctx):\n    pass\n"
    )
    proc = session("", str(test))
    out = out_of(proc)
    assert proc.returncode != 0
    assert "@pytest.mark.simdist on test_x: break_at: op 'allreduce' is not a call simdist records" in out


def test_post_mortem_must_be_a_bool():
    with pytest.raises(TypeError, match="post_mortem must be True or False, got 'yes'"):
        simdist.run(lambda ctx: None, world_size=1, post_mortem="yes")


# -- 3 and 5: from the prompt and on demand ---------------------------------


def test_debug_helpers_show_every_rank_from_inside_a_run():
    seen = {}

    def body(ctx):
        local_value = ctx.rank + 40
        t = torch.ones(1)
        if ctx.rank == 1:
            dist.send(t, dst=0)
            dist.all_reduce(t)  # waits for rank 0, frozen while rank 0 looks
            return None
        dist.recv(t, src=1)  # lets rank 1 run up to its all_reduce
        seen["ranks"] = str(debug.ranks())
        seen["locals"] = debug.locals_of(1)
        seen["stacks"] = str(debug.stacks())
        buffer = io.StringIO()
        debug.dump(file=buffer)
        seen["dump"] = buffer.getvalue()
        seen["local"] = local_value
        with pytest.raises(ValueError, match=r"rank must be a rank of this world \(0 to 1\), got 5"):
            debug.frame(5)
        dist.all_reduce(t)
        return None

    simdist.run(body, world_size=2)
    assert (
        "rank 1 (rank 1 of 2): waiting in all_reduce on world [0, 1] seq 0; still missing rank(s) [0]"
        in seen["ranks"]
    )
    assert "rank 0 (rank 0 of 2): running" in seen["ranks"]
    assert "tests/debug/test_debug.py" in str(seen["stacks"]) and "thread simdist-rank-0" in seen["stacks"]
    assert seen["locals"]["local_value"] == 41
    assert "test_debug.py" in seen["stacks"] and "in body" in seen["stacks"]
    assert "stacks on demand" in seen["dump"] and "thread simdist-rank-1" in seen["dump"]
    assert "last calls per rank (flight recorder):" in seen["dump"]
    assert str(debug.ranks()) == "simdist: no run is in progress"


def test_helpers_of_a_rank_are_in_the_dump():
    seen = {}

    def body(ctx):
        if ctx.rank == 0:
            release = threading.Event()
            helper = threading.Thread(target=release.wait, name="loader")
            helper.start()
            seen["dump"] = str(debug.stacks())
            release.set()
            helper.join()

    simdist.run(body, world_size=2)
    assert "helper thread 'loader'" in seen["dump"]


def test_sigusr1_prints_every_ranks_stack_and_the_run_goes_on(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time, torch, torch.distributed as dist, simdist

            def body(ctx):
                if ctx.rank == 1:
                    print("STARTED", flush=True)
                    end = time.monotonic() + 3
                    while time.monotonic() < end:  # "stuck" in a loop
                        time.sleep(0.01)
                dist.barrier()
                return ctx.rank

            print("RESULT", simdist.run(body, world_size=2, timeout=60), flush=True)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "STARTED"
        time.sleep(0.3)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=_TIMEOUT)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert "RESULT [0, 1]" in out
    assert "stacks on demand" in err
    assert "rank 0 (rank 0 of 2): waiting in barrier on world [0, 1] seq 0" in err
    assert "rank 1 (rank 1 of 2): running" in err and "stuck.py" in err


def test_faulthandler_timeout_output_names_the_rank_threads():
    proc = session("", "-o", "faulthandler_timeout=1", target("test_slow_rank"))
    out = out_of(proc)
    assert "1 passed" in out, out
    assert "Timeout (0:00:01)!" in out  # faulthandler's own, threads by id only
    assert "stacks on demand" in out and "[thread simdist-rank-0, 0x" in out
    assert "failing_ranks.py" in out


# -- 6: traces of failing runs --------------------------------------------------


def test_trace_on_failure_keeps_the_failed_tests_trace_only(tmp_path):
    traces = tmp_path / "traces"
    proc = session(
        "",
        "--simdist-trace-on-failure",
        str(traces),
        target("test_rank1_disagrees"),
        target("test_trace_of_caught_failure_is_not_kept"),
    )
    out = out_of(proc)
    assert "1 failed, 1 passed" in out, out
    [written] = list(traces.glob("*.json"))
    assert "test_rank1_disagrees" in written.name
    events = json.loads(written.read_text())["traceEvents"]
    calls = [e for e in events if e.get("ph") == "X"]
    assert {e["name"] for e in calls} >= {"all_reduce"}
    assert "simdist trace of the failing run" in out


def test_trace_failures_through_the_environment(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        "import simdist\n"
        "def body(ctx):\n    assert ctx.rank == 0\n"
        "try:\n    simdist.run(body, world_size=2)\n"
        "except simdist.RankError as e:\n    print('NOTES', getattr(e, '__notes__', None))\n"
        "print(simdist.run(lambda ctx: ctx.rank, world_size=2))\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
        env={**os.environ, "SIMDIST_TRACE_ON_FAILURE": str(tmp_path / "t")},
    )
    assert proc.returncode == 0, out_of(proc)
    [written] = list((tmp_path / "t").glob("*.json"))  # the passing run wrote none
    assert "Perfetto trace of this failing run" in proc.stdout and written.name in proc.stdout


def test_fuzz_accepts_trace_failures_and_exports_it(tmp_path, monkeypatch):
    import argparse

    from simdist.debug import _cli

    parser = argparse.ArgumentParser()
    _cli.add_fuzz_arguments(parser)
    monkeypatch.delenv("SIMDIST_TRACE_ON_FAILURE", raising=False)
    args = parser.parse_args(["--trace-failures", str(tmp_path / "ft")])
    with _cli.fuzz_scope(args):
        assert os.environ["SIMDIST_TRACE_ON_FAILURE"] == str(tmp_path / "ft")
    assert "SIMDIST_TRACE_ON_FAILURE" not in os.environ  # the campaign's only: put back after it
    monkeypatch.setenv("SIMDIST_TRACE_ON_FAILURE", str(tmp_path / "mine"))
    with _cli.fuzz_scope(args):
        assert os.environ["SIMDIST_TRACE_ON_FAILURE"] == str(tmp_path / "ft")
    assert os.environ["SIMDIST_TRACE_ON_FAILURE"] == str(tmp_path / "mine")
    assert parser.parse_args(["--trace-failures"]).trace_failures == _cli.DEFAULT_FUZZ_TRACES


# -- replay ------------------------------------------------------------------------


def _case(tmp_path: Path) -> Path:
    case = tmp_path / "case.json"
    case.write_text(
        json.dumps(
            {
                "format": "simdist-fuzz-case/1",
                "target": "tests/debug/targets/replay_target.py::test_steps_property",
                "case": {"steps": 4},
                "error": {"type": "RankError", "message": "planted"},
                "found": {},
            }
        )
    )
    return case


def replay(tmp_path: Path, commands: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "simdist.cli", "replay", str(_case(tmp_path)), *args],
        cwd=ROOT,
        input=commands,
        capture_output=True,
        text=True,
        timeout=_TIMEOUT,
    )


def test_replay_pdb_opens_in_the_failing_rank(tmp_path):
    proc = replay(tmp_path, "p step, x\nc\n", "--pdb")
    out = out_of(proc)
    assert proc.returncode == 1, out
    # Failed after its third all_reduce; Hypothesis runs the failing example
    # again to report it: the debugger opened once all the same.
    assert "(Pdb rank 1 of 2) (2, tensor([8.]))" in out and out.count("simdist post-mortem") == 1
    assert "FAILS" in out


def test_replay_break_at_stops_one_call_before_the_failure(tmp_path):
    proc = replay(tmp_path, "p step\nc\n", "--break-at", "rank=1,seq=2")
    out = out_of(proc)
    assert proc.returncode == 1, out
    assert "stops just before rank 1's call #1 matching seq=2: all_reduce on world [0, 1] seq 2" in out
    assert "(Pdb rank 1 of 2) 2\n" in out


def test_replay_refuses_a_bad_break_at(tmp_path, capsys, monkeypatch):
    # Refused while the command line is parsed, before any case runs: checked in this
    # process (a process of its own would only import torch again).
    from simdist.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the current directory on it
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(_case(tmp_path)), "--break-at", "rank=1,opp=x"])
    assert exited.value.code == 2
    assert "unknown key(s) opp" in capsys.readouterr().err


def test_defaults_refuses_a_typo_and_scopes_its_settings():
    with pytest.raises(TypeError, match=r"debug\.defaults: unknown setting"):
        with debug.defaults(post_mortme=True):
            pass
    with debug.defaults(break_at="rank=0,op=broadcast") as settings:
        assert settings.break_at == debug.BreakAt(rank=0, op="broadcast")
    with pytest.raises(ValueError, match="break_at: nth counts calls from 1"):
        with debug.defaults(break_at={"rank": 0, "nth": -2}):
            pass


def test_stacks_outside_any_run_says_so():
    with pytest.raises(RuntimeError, match=r"simdist.debug.stacks: no run is in progress"):
        debug.stacks()
    assert simdist.dump is debug.dump


def test_every_op_a_trace_records_can_be_a_break_at_op(tmp_path):
    """break_at's op names are those the trace records: a call simdist records
    (a sparse all_reduce among them) must not be refused as a typo."""
    path = tmp_path / "trace.json"

    def body(ctx):
        dense = torch.ones(2)
        dist.all_reduce(dense)
        sparse = torch.sparse_coo_tensor([[ctx.rank]], [1.0], (2,))
        dist.all_reduce(sparse)
        dist.barrier()
        if ctx.rank == 0:
            dist.send(dense, 1)
        else:
            dist.recv(dense, 0)

    simdist.run(body, world_size=2, trace=str(path))
    ops = {e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"}
    assert {"all_reduce", "barrier", "send", "recv"} <= ops
    assert len(ops) >= 5, ops  # the sparse all_reduce is recorded under a name of its own
    for op in sorted(ops):
        simdist.debug.parse_break_at({"rank": 0, "op": op}, 2)  # raises for an unknown op


def test_known_ops_are_the_ops_table_rows():
    """KNOWN_OPS is written out (its module must not import torch): it names
    exactly the ops the backend's table completes."""
    from simdist._backend.ops import OPS

    assert sorted(debug.KNOWN_OPS) == sorted(OPS)
