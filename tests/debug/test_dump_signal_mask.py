"""SIGUSR1's stack dump comes while a run is stuck, whichever thread the
kernel would pick (issue 28, point 16): rank threads, and the helper threads
they start (which inherit their mask), block SIGUSR1, so a SIGUSR1 sent to
the process goes to the main thread, whose wait it interrupts. Delivered to a
rank thread, the handler ran only once the run had ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import simdist

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")

TIMEOUT = 60.0


def _blocks_usr1() -> bool:
    return signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_rank_threads_and_their_helpers_leave_sigusr1_to_the_main_thread() -> None:
    def body(ctx: simdist.RankContext) -> tuple[bool, bool]:
        seen: list[bool] = []
        helper = threading.Thread(target=lambda: seen.append(_blocks_usr1()))
        helper.start()
        helper.join()
        return _blocks_usr1(), seen[0]

    for _ in range(2):  # new threads, then parked ones
        assert simdist.run(body, world_size=3, timeout=TIMEOUT) == [(True, True)] * 3
    assert not _blocks_usr1()  # the caller's own mask is untouched


def test_a_sigusr1_sent_while_a_run_is_stuck_dumps_before_it_ends(tmp_path) -> None:
    script = tmp_path / "stuck.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, signal, sys, threading, time
            import torch, torch.distributed as dist
            import simdist

            computing = threading.Event()

            def body(ctx):
                t = torch.zeros(1)
                if ctx.rank == 0:
                    dist.recv(t, src=1)  # waits until rank 1 has computed
                else:
                    computing.set()
                    time.sleep(4.0)
                    dist.send(t, dst=0)

            def poke():
                # Once a rank runs, the run's handler is in place (a signal sent
                # at a fixed time could come before it on a loaded machine).
                computing.wait(60)
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGUSR1)

            threading.Thread(target=poke, daemon=True).start()
            simdist.run(body, world_size=2, timeout=60)
            print("RUN ENDED", flush=True)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stderr + proc.stdout
    assert "rank 0" in proc.stderr, out  # the dump, on stderr
    assert "RUN ENDED" in proc.stdout
