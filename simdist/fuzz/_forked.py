"""Workers forked from the campaign process, which has torch, simdist, pytest and
Hypothesis imported already: a worker starts by collecting the target, not by
starting Python and importing torch again (seconds per worker, more when
several workers import at once on a loaded machine).

``ForkedWorker`` behaves as the part of ``subprocess.Popen`` the campaign
uses. ``SIMDIST_FUZZ_SPAWN=1`` (or a platform without ``fork``) starts
workers as fresh ``python -m pytest`` processes instead. The campaign forks
one worker server (``_zygote``) this way, which collects the target once and
forks the workers; ``SIMDIST_FUZZ_SERVER=0`` forks each worker from the
campaign instead, as before the server. Either way only with one intra-op
thread (a fork of a process whose OpenMP pool ran hangs with more).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO

__all__ = ["ForkedWorker", "fork_available"]


def fork_available() -> bool:
    return hasattr(os, "fork") and os.environ.get("SIMDIST_FUZZ_SPAWN") != "1"


class ForkedWorker:
    def __init__(self, pytest_args: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 3
            try:
                code = _child(pytest_args, env, log)
            finally:
                os._exit(code)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        limit = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if limit is not None and time.monotonic() >= limit:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _child(pytest_args: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> int:
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.environ.clear()
    os.environ.update(env)
    # The parent's Ctrl-C handling is the campaign's, not the worker's.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    # As `python -m pytest` run from the campaign's directory would see it.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    import pytest

    return int(pytest.main(list(pytest_args)))
