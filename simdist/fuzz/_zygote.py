"""One start-up for every worker: a server process collects the target once, then forks the workers.

The campaign forks a single server (with torch, simdist and Hypothesis
imported already). It runs pytest on the target exactly as a worker would
(conftest files, assertion rewriting, the target's modules imported, its
properties collected); at the point where a worker's run loop would begin,
it forks the campaign's N workers instead, each then running every round of
its properties in that one process. The server reaps them and writes each
one's exit status beside the run's logs; ``ServerWorker`` reads those and
stands for one worker with the part of ``subprocess.Popen`` the campaign uses.

Threads: forking a process whose OpenMP pool has started leaves the children
hanging in their first parallel region when they use more than one thread
(measured with torch 2.13: a 1500x1500 matmul). The server therefore
collects with one intra-op thread, and the campaign uses the server only when
the workers run one thread too (the default, ``OMP_NUM_THREADS=1``), which
never touches a pool, even one the campaign process started (``run_campaign``
called from a test). With more threads each worker is a fresh process
(``python -m pytest``) with an OpenMP pool of its own.

pytest's output capture is off in the server's workers (``--capture=no``):
captured output lives in one temporary file that forked workers would share.
What a property prints goes straight to its worker's log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ._forked import ForkedWorker
from ._orphans import kill_when_parent_dies

__all__ = ["ServerWorker", "WorkerServer", "fork_workers", "server_usable"]

ENV_WORKERS = "SIMDIST_FUZZ_SERVER_WORKERS"  # set in the server: how many workers to fork
ENV_SEEDS = "SIMDIST_FUZZ_SERVER_SEEDS"  # comma-separated, one per worker
STARTUP_LOG = "startup.log"  # the server's own output (collection errors land here)


def server_usable(env: Mapping[str, str]) -> bool:
    """Workers may come from the server: one intra-op thread (see the module docstring)."""
    return env.get("OMP_NUM_THREADS", "") == "1" and os.environ.get("SIMDIST_FUZZ_SERVER") != "0"


def _pid_file(run_dir: Path, k: int) -> Path:
    return run_dir / f"worker-{k}.pid"


def _exit_file(run_dir: Path, k: int) -> Path:
    return run_dir / f"worker-{k}.exit"


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # atomic: the campaign never reads half a number


class WorkerServer:
    """The campaign's side: starts the server, answers for each worker."""

    def __init__(
        self, pytest_args: Sequence[str], env: Mapping[str, str], seeds: Sequence[int], run_dir: Path
    ) -> None:
        # Imported here, once, so the server (and every worker) starts with them.
        import hypothesis  # noqa: F401
        import pytest  # noqa: F401

        self.run_dir = run_dir
        self.count = len(seeds)
        env = {**env, ENV_WORKERS: str(self.count), ENV_SEEDS: ",".join(str(s) for s in seeds)}
        env.pop("SIMDIST_FUZZ_INDEX", None)
        env.pop("SIMDIST_FUZZ_SEED", None)
        self._log = open(run_dir / STARTUP_LOG, "wb")
        try:
            self.server = ForkedWorker(pytest_args, env, self._log)
        finally:
            self._log.close()
        self.workers = [ServerWorker(self, k) for k in range(self.count)]

    def pid_of(self, k: int) -> int | None:
        try:
            return int(_pid_file(self.run_dir, k).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def exit_of(self, k: int) -> int | None:
        try:
            return int(_exit_file(self.run_dir, k).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
        server_code = self.server.poll()
        if server_code is None:
            return None
        pid = self.pid_of(k)
        if pid is None:
            # Never forked: the server ended while collecting (a collection
            # error, Ctrl-C), and this worker with it.
            return server_code
        # Forked, and the server is gone without its exit status: it died.
        return None if _alive(pid) else 3

    def close(self) -> None:
        """Reap the server once its workers have ended (it exits right after them)."""
        try:
            self.server.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()

    def signal(self, k: int, sig: int) -> None:
        pid = self.pid_of(k)
        target = pid if pid is not None else (self.server.pid if self.server.poll() is None else None)
        if target is None:
            return
        try:
            os.kill(target, sig)
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


class ServerWorker:
    """One worker of the server, as ``subprocess.Popen``: poll, wait, send_signal, kill, returncode."""

    def __init__(self, server: WorkerServer, k: int) -> None:
        self._server = server
        self._k = k
        self.returncode: int | None = None

    @property
    def pid(self) -> int | None:
        return self._server.pid_of(self._k)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_of(self._k)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        limit = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if limit is not None and time.monotonic() >= limit:
                raise subprocess.TimeoutExpired(f"worker {self._k}", timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._server.signal(self._k, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        self._server.close()


# ------------------------------------------------------------ in the server


def fork_workers(run_dir: Path, logs: Sequence[IO[bytes]] | None = None) -> tuple[int, int] | None:
    """In the server, once the target is collected: fork the workers.

    Returns ``(index, seed)`` in each worker; the server itself never returns
    (it reaps the workers, writes their exit status and exits). None when this
    process is not a server (a worker started on its own)."""
    count = os.environ.get(ENV_WORKERS)
    if not count:
        return None
    seeds = [int(s) for s in os.environ[ENV_SEEDS].split(",")]
    import sys

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
            kill_when_parent_dies(server)  # the server ends with the campaign (_orphans)
            return k, seeds[k]
        pids[pid] = k
        _write(_pid_file(run_dir, k), str(pid))
    while pids:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        k = pids.pop(pid, -1)
        if k >= 0:
            _write(_exit_file(run_dir, k), str(os.waitstatus_to_exitcode(status)))
    os._exit(0)


def _become_worker(run_dir: Path, k: int, seed: int) -> None:
    log = os.open(run_dir / f"worker-{k}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.pop(ENV_WORKERS, None)
    os.environ.pop(ENV_SEEDS, None)
    os.environ["SIMDIST_FUZZ_INDEX"] = str(k)
    os.environ["SIMDIST_FUZZ_SEED"] = str(seed)
    # The server's one intra-op thread is inherited (server_usable).
    signal.signal(signal.SIGINT, signal.default_int_handler)
