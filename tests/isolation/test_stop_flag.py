"""A stop simdist could not deliver never stalls a thread that traces.

On CPython 3.11 a pending asynchronous exception keeps an interpreter-wide
flag set until its thread handles it, and while it is set a thread with a
trace function (``sys.settrace``, coverage, pdb) loops for ever at its next
function entry. A helper blocked in native code that its rank's end could not
stop keeps its stop pending for as long as it stays blocked; so did a stop
taken back by clearing it (the order-dependent hang of
``test_a_trace_function_a_rank_left_set_is_not_inherited``). Each case runs in
a fresh interpreter, bounded: on the old code the traced rank never returned
and the run timed out.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PROGRAM = textwrap.dedent(
    """
    import sys, threading
    import simdist

    release = threading.Event()

    def leave_a_blocked_helper(ctx):
        if ctx.rank == 0:  # blocked in C: its stop cannot land until release.set()
            threading.Thread(target=release.wait, name="blocked-in-c", daemon=True).start()

    try:
        simdist.run(leave_a_blocked_helper, world_size=2, timeout=30.0)
    except simdist.RankError as err:
        print("helper left:", "could not be stopped" in str(err))

    def trace_then_return(ctx):
        sys.settrace(lambda *a: None)
        return ctx.rank

    try:
        print("traced ranks:", simdist.run(trace_then_return, world_size=2, timeout=10.0, schedule=SCHEDULE))
    except simdist.SimulationTimeout:
        print("traced ranks: timed out")

    done = threading.Event()

    def traced_thread():
        sys.settrace(lambda *a: None)
        (lambda: None)()
        sys.settrace(None)
        done.set()

    threading.Thread(target=traced_thread, daemon=True).start()
    print("traced thread returned:", done.wait(10.0))
    release.set()
    # The released helper ends before the interpreter does (its thread is
    # simdist's helper: it must leave nothing in torch's thread state that
    # the thread's exit would hand back to a finalising interpreter).
    for thread in threading.enumerate():
        if thread.name == "blocked-in-c":
            thread.join(10.0)
    """
)


@pytest.mark.parametrize("schedule", ["rank", "concurrent"])
def test_a_rank_that_traces_after_a_helper_was_left_blocked_still_returns(schedule: str) -> None:
    script = f"SCHEDULE = {schedule!r}\n" + _PROGRAM
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "helper left: True",
        "traced ranks: [0, 1]",
        "traced thread returned: True",
    ], proc.stdout + proc.stderr
