"""A campaign's worker processes (docs/campaigns.md, "Start-up"), forked from processes
that have torch, simdist, pytest and Hypothesis imported already: a worker
starts by collecting the target, not by starting Python and importing torch
again (seconds per worker, more when several import at once on a loaded machine).

By default one worker server collects the target as a worker would, then
forks the N workers where a worker's run loop would begin; it reaps them and
writes each one's pid and exit status beside the run's logs, which
``ServerWorker`` reads. ``SIMDIST_FUZZ_SERVER=0`` forks each worker from the
campaign (``ForkedWorker``); ``SIMDIST_FUZZ_SPAWN=1`` (or a platform without
``fork``) starts fresh ``python -m pytest`` processes. Both classes behave as
the part of ``subprocess.Popen`` the campaign uses.

Threads: forking a process whose OpenMP pool has started leaves the children
hanging in their first parallel region when they use more than one thread
(measured with torch 2.13: a 1500x1500 matmul). The server therefore
collects with one intra-op thread, and the campaign forks (a server or its
workers) only when the workers run one thread too (the default,
``OMP_NUM_THREADS=1``), which never touches a pool, even one the campaign
process started (``run_campaign`` called from a test). With more threads
each worker is a fresh process with an OpenMP pool of its own.

pytest's output capture is off in the server's workers (``--capture=no``):
captured output lives in one temporary file that forked workers would share.

Orphans: a supervisor killed outright (SIGKILL, an out-of-memory kill) runs
none of its stop path, and its workers would search on, unseen, to the end of
their budgets. On Linux each worker, and the worker server, asks the kernel
to kill it when its parent dies (``PR_SET_PDEATHSIG``): a server's workers
then go with the server. Nobody reads their events any more, so nothing is
lost that a gentler stop would keep, and a kill needs no cooperation (a
SIGINT passed on by the server was tried first and did not always stop its
workers). Elsewhere workers end at their budgets.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ._stats import worker_file

__all__ = [
    "ENV_WORKERS",
    "STARTUP_LOG",
    "ForkedWorker",
    "ServerWorker",
    "fork_available",
    "fork_workers",
    "kill_when_parent_dies",
    "server_usable",
    "start_server",
]

ENV_WORKERS = "SIMDIST_FUZZ_SERVER_WORKERS"  # set in the server: how many workers to fork
ENV_SEEDS = "SIMDIST_FUZZ_SERVER_SEEDS"  # comma-separated, one per worker
STARTUP_LOG = "startup.log"  # the server's own output (collection errors land here)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def fork_available() -> bool:
    return hasattr(os, "fork") and os.environ.get("SIMDIST_FUZZ_SPAWN") != "1"


def server_usable(env: Mapping[str, str]) -> bool:
    """Workers may come from the server: one intra-op thread (see the module docstring)."""
    return env.get("OMP_NUM_THREADS", "") == "1" and os.environ.get("SIMDIST_FUZZ_SERVER") != "0"


def kill_when_parent_dies(parent: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent (pid ``parent``)
    ends, and end now if it already has. False where the OS has no such request."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # The parent may have died before the request: the kernel sends nothing then.
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Process:
    """The part of ``subprocess.Popen`` the campaign uses: poll, wait, send_signal, kill, returncode."""

    returncode: int | None = None
    name = "worker"  # what a wait past its timeout names

    def _exit_status(self) -> int | None:
        raise NotImplementedError

    def _send(self, sig: int) -> None:
        raise NotImplementedError

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._exit_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        limit = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if limit is not None and time.monotonic() >= limit:
                raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._send(sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedWorker(_Process):
    """``python -m pytest ARGS`` in a child forked from this process."""

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
        self.name = f"worker {pid}"

    def _exit_status(self) -> int | None:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if pid == self.pid else None

    def _send(self, sig: int) -> None:
        _signal(self.pid, sig)


def _child(pytest_args: Sequence[str], env: Mapping[str, str], log: IO[bytes]) -> int:
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
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


def start_server(
    pytest_args: Sequence[str], env: Mapping[str, str], seeds: Sequence[int], run_dir: Path
) -> list[ServerWorker]:
    """Fork the worker server; one ``ServerWorker`` per seed stands for the worker it will fork."""
    # Imported here, once, so the server (and every worker) starts with them.
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401

    env = {**env, ENV_WORKERS: str(len(seeds)), ENV_SEEDS: ",".join(str(s) for s in seeds)}
    env.pop("SIMDIST_FUZZ_INDEX", None)
    env.pop("SIMDIST_FUZZ_SEED", None)
    with open(run_dir / STARTUP_LOG, "wb") as log:
        server = ForkedWorker(pytest_args, env, log)
    return [ServerWorker(server, run_dir, k) for k in range(len(seeds))]


class ServerWorker(_Process):
    """One worker of the server, known by the pid and exit files the server writes."""

    def __init__(self, server: ForkedWorker, run_dir: Path, k: int) -> None:
        self._server = server
        self._run_dir = run_dir
        self._k = k
        self.name = f"worker {k}"

    def _read(self, suffix: str) -> int | None:
        try:
            return int(worker_file(self._run_dir, self._k, suffix).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _exit_status(self) -> int | None:
        code = self._read("exit")
        if code is not None:
            return code
        server_code = self._server.poll()
        if server_code is None:
            return None
        pid = self._read("pid")
        if pid is None:
            # Never forked: the server ended while collecting (a collection
            # error, Ctrl-C), and this worker with it.
            return server_code
        # Forked, and the server is gone without its exit status: it died.
        return None if _alive(pid) else 3

    def _send(self, sig: int) -> None:
        pid = self._read("pid")
        target = pid if pid is not None else (self._server.pid if self._server.poll() is None else None)
        if target is not None:
            _signal(target, sig)

    def close(self) -> None:
        """Reap the server once its workers have ended (it exits right after them)."""
        try:
            self._server.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()


# ------------------------------------------------------------ in the server


def fork_workers(run_dir: Path) -> tuple[int, int] | None:
    """In the server, once the target is collected: fork the workers.

    Returns ``(index, seed)`` in each worker; the server itself never returns
    (it reaps the workers, writes their exit status and exits). None when this
    process is not a server (a worker started on its own)."""
    count = os.environ.get(ENV_WORKERS)
    if not count:
        return None
    seeds = [int(s) for s in os.environ[ENV_SEEDS].split(",")]
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C reaches the whole process group: the workers handle it (each
    # puts the handler back); the server must outlive them to say how they ended.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pids: dict[int, int] = {}
    server = os.getpid()
    for k in range(int(count)):
        pid = os.fork()
        if pid == 0:
            _become_worker(run_dir, k, seeds[k])
            kill_when_parent_dies(server)  # the server ends with the campaign
            return k, seeds[k]
        pids[pid] = k
        _write(worker_file(run_dir, k, "pid"), str(pid))
    while pids:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        k = pids.pop(pid, -1)
        if k >= 0:
            _write(worker_file(run_dir, k, "exit"), str(os.waitstatus_to_exitcode(status)))
    os._exit(0)


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # atomic: the campaign never reads half a number


def _become_worker(run_dir: Path, k: int, seed: int) -> None:
    log = os.open(worker_file(run_dir, k, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.pop(ENV_WORKERS, None)
    os.environ.pop(ENV_SEEDS, None)
    os.environ["SIMDIST_FUZZ_INDEX"] = str(k)
    os.environ["SIMDIST_FUZZ_SEED"] = str(seed)
    # The server's one intra-op thread is inherited (server_usable).
    signal.signal(signal.SIGINT, signal.default_int_handler)
