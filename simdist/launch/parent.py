"""The caller's side of ``run_processes``: check, start the rank processes, wait with deadlines, collect."""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .._checks import check_choice
from .._run.options import RunOptions
from ..errors import RankError, SimulationTimeout
from ..layout import Layout
from . import child
from .child import RemoteError, RemoteTraceback, _Outcome, dumps, outcome_path

# After the first rank fails, how long its peers may take to report their own
# (possibly independent) failures before the rest of the world is killed.
_FAILURE_GRACE_S = 5.0
_KILL_JOIN_S = 5.0


def run_processes(
    fn: Callable[..., Any],
    *,
    layout: Layout | None = None,
    world_size: int | None = None,
    backend: str = "gloo",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    timeout: float = 120.0,
    device: str = "cpu",
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(ctx, *args, **kwargs)`` once per rank, each rank a real process.

    Returns the per-rank results indexed by global rank, with tensors moved to
    CPU. ``fn`` (and ``args``/``kwargs``) must be picklable: a module-level
    function, not a lambda or closure. ``backend="nccl"`` needs
    ``device="cuda"`` and one GPU per rank.

    Raises ``RankError`` when a rank raises (its ``failures`` map ranks to
    their exceptions, each chained to a ``RemoteTraceback``), and
    ``SimulationTimeout`` when the world has not finished within ``timeout``
    seconds (process start-up included); in both cases every process has been
    killed and reaped. ``start_method`` is "forkserver" (default where
    available: later worlds fork from an interpreter with torch imported) or
    "spawn".
    """
    # The world and the timeout by simdist.run's own checks and words.
    size = RunOptions(layout=layout, world_size=world_size, timeout=timeout, caller="run_processes").size
    kwargs = {} if kwargs is None else kwargs
    _check_options(fn, args, kwargs, backend, device, size)
    payload = _pickle_call(fn, args, kwargs)
    method = _choose_start_method(start_method)
    mp_ctx: Any = multiprocessing.get_context(method)  # typeshed's BaseContext lacks Process
    if method == "forkserver":
        # Only takes effect when this call starts the forkserver; later worlds
        # then fork from an interpreter that has torch imported.
        mp_ctx.set_forkserver_preload(["torch", "torch.distributed", child.__name__])

    workdir = tempfile.mkdtemp(prefix="simdist-launch-")
    procs: dict[int, multiprocessing.process.BaseProcess] = {}
    try:
        for rank in range(size):
            proc = mp_ctx.Process(
                target=child.worker_main,
                args=(rank, size, layout, backend, device, timeout, workdir, payload),
                name=f"simdist-rank-{rank}",
                # Not daemonic: a daemon may not start children, and rank bodies
                # may (DataLoader workers). The finally below reaps every rank.
                daemon=False,
            )
            proc.start()
            procs[rank] = proc
        killed, timed_out, exited_at = _wait_for_world(procs, timeout)
        outcomes = {rank: _read_outcome(workdir, rank) for rank in range(size)}
        exitcodes = {rank: procs[rank].exitcode for rank in range(size)}
    finally:
        _kill_all(procs.values())
        shutil.rmtree(workdir, ignore_errors=True)
    return _collect(outcomes, exitcodes, killed, timed_out, timeout, exited_at)


def _check_options(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    backend: str,
    device: str,
    size: int,
) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
    check_choice("backend", backend, ("gloo", "nccl"))
    check_choice("device", device, ("cpu", "cuda"))
    if backend == "nccl" and device != "cuda":
        raise ValueError("backend='nccl' works on CUDA tensors only: pass device='cuda'")
    if device == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available < size:
            raise ValueError(
                f"device='cuda' gives each rank its own GPU: {size} ranks need {size} GPUs, "
                f"this machine has {available}"
            )


def _pickle_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    # Pickle here, not in the child, so a lambda or closure fails in the
    # caller's process with a message saying what to change.
    try:
        return dumps((fn, tuple(args), dict(kwargs)))
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"run_processes sends fn, args and kwargs to other processes by pickling; "
            f"pickling {name!r} and its arguments failed ({type(exc).__name__}: {exc}). "
            f"Define fn at module level (no lambda, closure or nested function)."
        ) from exc


def _choose_start_method(start_method: str | None) -> str:
    available = multiprocessing.get_all_start_methods()
    if start_method is None:
        return "forkserver" if "forkserver" in available else "spawn"
    # 'fork' would copy this process's threads and torch state mid-flight.
    allowed = [m for m in ("forkserver", "spawn") if m in available]
    if start_method not in allowed:
        raise ValueError(f"start_method must be one of {allowed}, got {start_method!r}")
    return start_method


def _wait_for_world(
    procs: dict[int, multiprocessing.process.BaseProcess], timeout: float
) -> tuple[list[int], bool, dict[int, float]]:
    """Wait until every rank exits; return (ranks killed, whether time ran out,
    when each rank that exited on its own was seen to exit, in time.time()).

    Once one rank has exited badly, the others get a short grace period to
    finish or report, then are killed: peers blocked in a collective with a
    dead rank would otherwise wait for the backend's own (long) timeout.
    """
    deadline = time.monotonic() + timeout
    pending = dict(procs)
    failed_at: float | None = None
    exited_at: dict[int, float] = {}
    while pending:
        limit = deadline if failed_at is None else min(deadline, failed_at + _FAILURE_GRACE_S)
        remaining = limit - time.monotonic()
        if remaining <= 0:
            break
        sentinels = {proc.sentinel: rank for rank, proc in pending.items()}
        for sentinel in multiprocessing.connection.wait(list(sentinels), timeout=remaining):
            rank = sentinels[sentinel]  # type: ignore[index]  # wait() returns the sentinels it was given
            proc = pending.pop(rank)
            proc.join()
            exited_at[rank] = time.time()
            if proc.exitcode != 0 and failed_at is None:
                failed_at = time.monotonic()
    killed = sorted(pending)
    timed_out = bool(killed) and failed_at is None
    _kill_all(pending.values())
    return killed, timed_out, exited_at


def _kill_all(procs: Any) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(_KILL_JOIN_S)


def _read_outcome(workdir: str, rank: int) -> _Outcome | None:
    """The rank's outcome, or None when it left none (killed, crashed)."""
    path = outcome_path(workdir, rank)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    try:
        outcome = pickle.loads(data)
    except Exception as exc:
        return _Outcome(
            ok=False,
            error=RemoteError(f"rank {rank}'s outcome could not be unpickled: {exc}"),
            type_name=type(exc).__name__,
            message=str(exc),
            at=time.time(),
        )
    assert isinstance(outcome, _Outcome)
    return outcome


def _collect(
    outcomes: dict[int, _Outcome | None],
    exitcodes: dict[int, int | None],
    killed: list[int],
    timed_out: bool,
    timeout: float,
    exited_at: dict[int, float],
) -> list[Any]:
    """Results, or one error that names the rank that went down first.

    A rank's own exception or a crash (an exit without an outcome) is a
    failure; a transport error (a peer's connection closed) is a consequence
    of one whenever there is one, and is reported as released.
    """
    if all(o is not None and o.ok for o in outcomes.values()):
        return [outcomes[rank].value for rank in sorted(outcomes)]  # type: ignore[union-attr]  # checked not None just above
    errors = {rank: o for rank, o in outcomes.items() if o is not None and not o.ok}
    # Ranks that exited without an outcome and were not killed by us crashed
    # (segfault, os._exit, out of memory): that is a failure of their own.
    crashed = sorted(r for r, o in outcomes.items() if o is None and r not in killed)
    if timed_out and not errors and not crashed:
        running = [r for r in killed if outcomes[r] is None]
        returned = sorted(r for r, o in outcomes.items() if o is not None and o.ok)
        parts = [f"ranks {running} were still running their body"] if running else []
        if returned:
            parts.append(
                f"ranks {returned} had returned (any still waiting for their peers to finish were killed too)"
            )
        raise SimulationTimeout(
            f"the world did not finish within timeout={timeout}s: "
            + "; ".join(parts)
            + "; every process has been killed"
        )

    own = {r: o for r, o in errors.items() if not o.is_transport_error}
    transport = {r: o for r, o in errors.items() if o.is_transport_error}
    when: dict[int, float] = {r: o.at for r, o in own.items()}
    when.update({r: exited_at.get(r, math.inf) for r in crashed})
    if not when:  # only transport errors: the earliest one is all we know
        first_transport = min(transport, key=lambda r: (transport[r].at, r))
        own = {first_transport: transport.pop(first_transport)}
        when = {first_transport: own[first_transport].at}
    order = sorted(when, key=lambda r: (when[r], r))

    failures: dict[int, BaseException] = {}
    lines: list[str] = []
    for rank in order:
        if rank in own:
            outcome = own[rank]
            failures[rank] = _rebuild_exception(outcome)
            lines.append(f"rank {rank} raised {outcome.type_name}: {outcome.message}")
        else:
            why = (
                f"rank {rank} exited with code {exitcodes[rank]}, no traceback: it crashed, was "
                f"killed by the OS, or failed while starting (its stderr says why; a script "
                f'that launches worlds needs an `if __name__ == "__main__":` guard)'
            )
            failures[rank] = RemoteError(why)
            lines.append(why)
    released = sorted(set(killed) | set(transport))
    first_rank = order[0]
    message = "; ".join(lines)
    if released:
        message += (
            f". Released after the failure (killed, or torch.distributed errors that "
            f"followed it): ranks {released}"
        )
    if first_rank in own:
        message += f"\n\nTraceback of rank {first_rank}:\n{own[first_rank].traceback_text}"
    error = RankError(message, failures, released=released)
    raise error from failures[first_rank]


def _rebuild_exception(outcome: _Outcome) -> BaseException:
    exc = outcome.error
    if exc is None:
        exc = RemoteError(f"{outcome.type_name}: {outcome.message}")
    try:
        exc.__cause__ = RemoteTraceback(outcome.traceback_text)
    except Exception:  # an exception type that forbids setting attributes
        pass
    return exc
