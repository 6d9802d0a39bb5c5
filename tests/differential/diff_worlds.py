"""The two worlds a differential program runs in: simdist, and a warm gloo world.

Starting a gloo world (processes, ``init_process_group``, connections) costs
far more than a small program, so ``GlooWorlds`` keeps one world per size
alive across cases: worker processes forked from a forkserver that has torch
and these modules imported, each with its default group and a cache of the
subgroups programs have asked for (every worker creates the same groups in the
same order, as ``new_group`` requires). A world that hangs is killed and the
next case gets a fresh one; a world in which a call was refused is checked
with a barrier on a group of its own before it is reused.

An outcome is, per rank, the records of the steps it reached (see
``diff_interpreter``); a rank stuck in a call has a "hang" record there. For
gloo that is a rank that stayed silent past the grace period, for simdist a
rank released by ``DeadlockError``.
"""

from __future__ import annotations

import atexit
import datetime
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import diff_interpreter
import torch
import torch.distributed as dist
from diff_program import Program

import simdist

Records = dict[int, dict[str, Any]]


@dataclass
class Outcome:
    """Per-rank step records, and the error the whole run ended with (if any)."""

    ranks: list[Records]
    run_error: str | None = None
    hung: list[int] = field(default_factory=list)


# ----------------------------------------------------------------------- simdist

_sinks: dict[int, dict[int, Records]] = {}
_sink_ids = itertools.count()
_sink_lock = threading.Lock()


def _simdist_body(ctx: Any, program: Program, sink_id: int) -> None:
    with _sink_lock:
        sink = _sinks[sink_id].setdefault(ctx.rank, {})
    groups = diff_interpreter.make_groups(program)
    diff_interpreter.run_rank(ctx.rank, program, groups, sink.__setitem__, ctx.device)


def run_simdist(program: Program, timeout: float = 60.0, **options: Any) -> Outcome:
    sink_id = next(_sink_ids)
    with _sink_lock:
        _sinks[sink_id] = {}
    error = None
    try:
        simdist.run(
            _simdist_body, world_size=program.world, args=(program, sink_id), timeout=timeout, **options
        )
    except simdist.SimulationError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        with _sink_lock:
            sink = _sinks.pop(sink_id)
    ranks = [sink.get(r, {}) for r in range(program.world)]
    hung = [r for r, recs in enumerate(ranks) if any(x["status"] == "hang" for x in recs.values())]
    return Outcome(ranks, error, hung)


# ------------------------------------------------------------------------- gloo

# How long a world may stay silent (no step finished anywhere) before the ranks
# that have not finished are declared stuck; a hang simdist does not see is
# confirmed with the longer wait on a fresh world (``run_gloo``).
QUIET_S = 2.5
CONFIRM_QUIET_S = 20.0
START_S = 120.0
PG_TIMEOUT_S = 300.0


def _stuck_at(records: dict[int, Any], steps: int) -> int | None:
    """The step a rank that stopped answering was in: the first it sent no
    record for, else the first async call it never finished waiting for."""
    for i in range(steps):
        if i not in records:
            return i
    return next((i for i in range(steps) if records[i]["status"] == "pending"), None)


def _send(conn: Any, message: Any) -> None:
    # Plain pickling: multiprocessing's own would move tensors through shared
    # memory file descriptors, slower for small tensors and leaky when killed.
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Any) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(rank: int, size: int, store_path: str, conn: Any) -> None:
    """A gloo rank that runs programs until told to stop."""
    torch.set_num_threads(1)
    # gloo's C++ checks log every refusal on stderr; the refusal itself comes
    # back as the step's record, so the log goes to the world's folder.
    log = os.open(os.path.join(os.path.dirname(store_path), f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 2)
    store = dist.FileStore(store_path, size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S)
    )
    health = dist.new_group(list(range(size)))
    groups: dict[tuple[int, ...], Any] = {}
    _send(conn, ("ready",))
    while True:
        message = _recv(conn)
        if message[0] == "stop":
            break
        if message[0] == "check":
            dist.barrier(group=health)
            _send(conn, ("checked",))
            continue
        program: Program = message[1]
        for s in program.steps:
            key = tuple(s["group"]) if s["group"] is not None else None
            if key is not None and key not in groups:
                groups[key] = dist.new_group(list(key))
        diff_interpreter.run_rank(rank, program, groups, lambda i, r: _send(conn, ("step", i, r)))
        _send(conn, ("done",))
    dist.destroy_process_group()


class GlooWorld:
    """``size`` gloo ranks kept alive between programs."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.workdir = tempfile.mkdtemp(prefix="simdist-diff-gloo-")
        mp = multiprocessing.get_context("forkserver")
        mp.set_forkserver_preload(["torch", "torch.distributed", "diff_interpreter", __name__])
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        store = os.path.join(self.workdir, "store")
        for rank in range(size):
            parent, child = mp.Pipe()
            proc = mp.Process(target=_serve, args=(rank, size, store, child), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self.alive = self._expect("ready", START_S)

    def _expect(self, what: str, within: float) -> bool:
        deadline = time.monotonic() + within
        for conn in self.conns:
            left = deadline - time.monotonic()
            if left <= 0 or not conn.poll(left):
                return False
            try:
                if _recv(conn)[0] != what:
                    return False
            except (EOFError, OSError):
                return False
        return True

    def run(self, program: Program, quiet: float = QUIET_S) -> Outcome:
        ranks: list[Records] = [{} for _ in range(self.size)]
        for conn in self.conns:
            _send(conn, ("program", program))
        waiting = dict(enumerate(self.conns))
        crashed: list[int] = []
        last = time.monotonic()
        while waiting:
            ready = multiprocessing.connection.wait(list(waiting.values()), timeout=0.5)
            for conn in ready:
                rank = self.conns.index(conn)
                try:
                    message = _recv(conn)
                except (EOFError, OSError):
                    waiting.pop(rank)
                    self.procs[rank].join(5)
                    crashed.append(rank)
                    self.alive = False
                    continue
                last = time.monotonic()
                if message[0] == "done":
                    waiting.pop(rank)
                else:
                    ranks[rank][message[1]] = message[2]
            if waiting and time.monotonic() - last > quiet:
                break
        for rank in crashed:
            stuck = _stuck_at(ranks[rank], len(program.steps))
            if stuck is not None:
                code = self.procs[rank].exitcode
                ranks[rank][stuck] = {
                    "status": "error",
                    "type": "crash",
                    "error": f"the gloo process died (exit code {code}): {self._log_tail(rank)}",
                }
        hung = sorted(waiting)
        for rank in hung:
            stuck = _stuck_at(ranks[rank], len(program.steps))
            if stuck is not None:
                ranks[rank][stuck] = {"status": "hang", "error": "no answer (gloo waits for its timeout)"}
        if hung or not self.alive:
            self.close()
        elif any(r["status"] == "error" for recs in ranks for r in recs.values()):
            for conn in self.conns:
                _send(conn, ("check",))
            if not self._expect("checked", QUIET_S):
                self.close()
        return Outcome(ranks, None, hung)

    def _log_tail(self, rank: int) -> str:
        try:
            with open(os.path.join(self.workdir, f"rank{rank}.log"), errors="replace") as f:
                return f.read()[-400:].strip()
        except OSError:
            return ""

    def close(self) -> None:
        self.alive = False
        for conn in self.conns:
            try:
                _send(conn, ("stop",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(0.5)
            if proc.is_alive():
                proc.kill()
        for proc in self.procs:
            proc.join(5)
        for conn in self.conns:
            conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class GlooWorlds:
    """Warm worlds by size, the least recently used closed beyond ``keep``."""

    def __init__(self, keep: int = 5) -> None:
        self.keep = keep
        self.worlds: OrderedDict[int, GlooWorld] = OrderedDict()
        self.started = 0

    def get(self, size: int) -> GlooWorld:
        world = self.worlds.pop(size, None)
        if world is None or not world.alive:
            if world is not None:
                world.close()
            world = GlooWorld(size)
            self.started += 1
            if not world.alive:
                world.close()
                raise RuntimeError(f"a gloo world of {size} ranks did not start within {START_S:g} s")
        self.worlds[size] = world
        while len(self.worlds) > self.keep:
            _, old = self.worlds.popitem(last=False)
            old.close()
        return world

    def run(self, program: Program, quiet: float = QUIET_S) -> Outcome:
        return self.get(program.world).run(program, quiet)

    def close(self) -> None:
        while self.worlds:
            _, world = self.worlds.popitem()
            world.close()


_worlds: GlooWorlds | None = None


def gloo_worlds() -> GlooWorlds:
    """The process's warm worlds (closed at exit)."""
    global _worlds
    if _worlds is None:
        _worlds = GlooWorlds(keep=int(os.environ.get("SIMDIST_DIFF_WORLDS", "5")))
        atexit.register(_worlds.close)
    return _worlds


def close_gloo_worlds() -> None:
    """Close the warm worlds now: the suite's other tests (tests/launch) check
    that no child process is left behind, so the worlds live one module long."""
    if _worlds is not None:
        _worlds.close()


def _records_body(ctx: Any, program: Program) -> Records:
    records: Records = {}
    groups = diff_interpreter.make_groups(program)
    diff_interpreter.run_rank(ctx.rank, program, groups, records.__setitem__, ctx.device)
    return records


def run_cold(program: Program, backend: str = "gloo", device: str = "cpu", timeout: float = 120.0) -> Outcome:
    """The program on a world started for it (``simdist.run_processes``): the way
    to run it on NCCL. A rank that fails takes the world down: outcome only for
    programs every rank completes."""
    from simdist.launch import run_processes

    ranks = run_processes(
        _records_body,
        world_size=program.world,
        backend=backend,
        device=device,
        args=(program,),
        timeout=timeout,
    )
    return Outcome(list(ranks))


def run_gloo(program: Program, expect_hang: bool = True) -> Outcome:
    """The program on a warm gloo world. With ``expect_hang=False`` (simdist
    saw no hang), a hang is confirmed by a second run that waits longer."""
    worlds = gloo_worlds()
    outcome = worlds.run(program)
    if outcome.hung and not expect_hang:
        outcome = worlds.run(program, CONFIRM_QUIET_S)
    return outcome
