"""Run a rank body on a real gloo/NCCL world: one spawned process per rank.

``run_processes`` is the real-world twin of ``simdist.run``: the body receives
the same ``RankContext`` (same layout groups, built by the same
``build_groups``), so one SPMD body can be run on the simulation and on a real
backend and the results compared.

Why the machinery looks the way it does:

* Processes come from a ``forkserver`` that has imported torch once, so every
  later world forks from a warm interpreter (about 0.1 s for 4 ranks instead of
  seconds of ``import torch`` per rank). Where ``forkserver`` is unavailable,
  ``spawn`` is used.
* Ranks meet through a ``FileStore`` in a private temporary folder: no TCP port
  has to be found free (and stay free) between choosing it and binding it.
* Each rank writes its outcome (result or exception) to its own file before it
  leaves, so a rank that is killed later still leaves its answer behind, and
  nothing depends on a queue's feeder thread outliving a crash.
* The parent only waits on process sentinels with deadlines: it can always kill
  the world, so a wrong program never hangs the caller.
"""

from __future__ import annotations

import datetime
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .context import RankContext, build_groups
from .errors import RankError, SimulationTimeout
from .layout import Layout

__all__ = [
    "RemoteTraceback",
    "run_processes",
    "run_torchrun_rank",
    "under_torchrun",
]

# After the first rank fails, how long its peers may take to report their own
# (possibly independent) failures before the rest of the world is killed.
_FAILURE_GRACE_S = 5.0
_KILL_JOIN_S = 5.0
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RemoteTraceback(Exception):
    """Carries a rank's traceback text; set as ``__cause__`` of its exception.

    Printing the chained exception then shows where, in the rank's process,
    the error was raised.
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


class RemoteError(Exception):
    """Stands in for a rank's exception that could not be pickled back."""


@dataclass(frozen=True)
class _Outcome:
    """What one rank left behind in its outcome file."""

    ok: bool
    value: Any = None  # the result when ok
    error: BaseException | None = None
    type_name: str = ""
    message: str = ""
    traceback_text: str = ""
    at: float = 0.0  # time.time() when the error was caught
    # A transport error (connection closed, backend timeout) after a peer had
    # already failed is a consequence of that failure, not a cause.
    is_transport_error: bool = False


# --------------------------------------------------------------------------- #
# Parent side
# --------------------------------------------------------------------------- #


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
    size = _check_world(layout, world_size)
    kwargs = {} if kwargs is None else kwargs
    _check_options(fn, args, kwargs, backend, device, timeout, size)
    payload = _pickle_call(fn, args, kwargs)
    method = _choose_start_method(start_method)
    mp_ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # Only takes effect when this call starts the forkserver; later worlds
        # then fork from an interpreter that has torch imported.
        mp_ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])

    workdir = tempfile.mkdtemp(prefix="simdist-launch-")
    procs: dict[int, multiprocessing.process.BaseProcess] = {}
    try:
        for rank in range(size):
            proc = mp_ctx.Process(
                target=_worker_main,
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


def _check_world(layout: Layout | None, world_size: int | None) -> int:
    if layout is not None and not isinstance(layout, Layout):
        raise TypeError(f"layout must be a simdist.Layout, got {type(layout).__name__}")
    if world_size is not None and (
        isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1
    ):
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if layout is None and world_size is None:
        raise ValueError("run_processes needs layout=Layout(...) or world_size=N, got neither")
    if layout is not None and world_size is not None and layout.world_size != world_size:
        raise ValueError(f"world_size={world_size} disagrees with {layout} (world size {layout.world_size})")
    return layout.world_size if layout is not None else world_size  # type: ignore[return-value]


def _check_options(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    backend: str,
    device: str,
    timeout: float,
    size: int,
) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list, got {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not (timeout > 0 and math.isfinite(timeout))
    ):
        raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
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
        return pickle.dumps((fn, tuple(args), dict(kwargs)), protocol=pickle.HIGHEST_PROTOCOL)
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
            rank = sentinels[sentinel]  # type: ignore[index]
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


def _outcome_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"outcome-{rank}.pkl")


def _read_outcome(workdir: str, rank: int) -> _Outcome | None:
    """The rank's outcome, or None when it left none (killed, crashed)."""
    path = _outcome_path(workdir, rank)
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
    exited_at: dict[int, float] | None = None,
) -> list[Any]:
    """Results, or one error that names the rank that went down first.

    A rank's own exception or a crash (an exit without an outcome) is a
    failure; a transport error (a peer's connection closed) is a consequence
    of one whenever there is one, and is reported as released.
    """
    if all(o is not None and o.ok for o in outcomes.values()):
        return [outcomes[rank].value for rank in sorted(outcomes)]  # type: ignore[union-attr]
    exited_at = exited_at or {}
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


# --------------------------------------------------------------------------- #
# Child side
# --------------------------------------------------------------------------- #


def _worker_main(
    rank: int,
    world_size: int,
    layout: Layout | None,
    backend: str,
    device: str,
    timeout: float,
    workdir: str,
    payload: bytes,
) -> None:
    # Like torchrun: several ranks on one machine each using every core would
    # oversubscribe it, so one intra-op thread unless the user chose otherwise.
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)
    outcome_path = _outcome_path(workdir, rank)
    initialised = False
    try:
        fn, args, kwargs = pickle.loads(payload)
        torch_device = _init_rank_device(rank, device)
        store = dist.FileStore(os.path.join(workdir, "store"), world_size)
        dist.init_process_group(
            backend,
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
        initialised = True
        ctx = RankContext(
            rank=rank,
            world_size=world_size,
            layout=layout,
            device=torch_device,
            groups=build_groups(layout),
            extras={"backend": backend},
        )
        # Every rank has finished connecting before any body runs: a rank that
        # fails at once would otherwise close its sockets while a peer is still
        # in gloo's connection set-up, and that peer would fail too.
        dist.barrier()
        value = _to_cpu(fn(ctx, *args, **kwargs))
        _write_outcome(outcome_path, _ok_outcome(rank, value))
    except BaseException as exc:
        _write_outcome(outcome_path, _error_outcome(exc))
        # Leave at once: our sockets closing is what tells peers blocked in a
        # collective with us that we are gone (instead of their long timeout).
        os._exit(1)
    if initialised:
        # Nobody tears down while a peer may still be receiving from it.
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer failed after we finished: our result stands
            os._exit(0)


def _init_rank_device(rank: int, device: str) -> torch.device:
    if device == "cuda":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_to_cpu(v) for v in value))
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _ok_outcome(rank: int, value: Any) -> _Outcome:
    outcome = _Outcome(ok=True, value=value)
    try:
        pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"rank {rank}'s result must be picklable to return it to the caller, "
            f"got {type(value).__name__} ({type(exc).__name__}: {exc})"
        ) from exc
    return outcome


def _error_outcome(exc: BaseException) -> _Outcome:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        # Checked here: an exception that pickles but fails to unpickle (custom
        # __init__ signature) would otherwise break the parent.
        carried: BaseException | None = exc
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        carried = None
    return _Outcome(
        ok=False,
        error=carried,
        type_name=type(exc).__qualname__,
        message=str(exc),
        traceback_text=text,
        at=time.time(),
        is_transport_error=_is_transport_error(exc),
    )


# Gloo reports a vanished peer as a plain RuntimeError; these phrases identify it.
_TRANSPORT_PHRASES = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "gloo/transport",
    "NCCL communicator was aborted",
)


def _is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(p in text for p in _TRANSPORT_PHRASES)


def _write_outcome(path: str, outcome: _Outcome) -> None:
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        data = pickle.dumps(
            _Outcome(
                ok=False,
                type_name=type(exc).__name__,
                message=f"the outcome could not be pickled: {exc}",
                at=time.time(),
            )
        )
    # Write then rename, so the parent never reads half a file.
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- #
# Under torchrun: the current process is one rank
# --------------------------------------------------------------------------- #


def under_torchrun() -> bool:
    """True when torchrun (or a similar launcher) has set this process's rank."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def run_torchrun_rank(
    fn: Callable[..., Any],
    *,
    layout: Layout | None = None,
    backend: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """Run ``fn(ctx, *args, **kwargs)`` as this process's rank of a torchrun job.

    The default group comes from the environment (``env://``); the layout's
    groups are built as in ``run_processes``. ``backend`` defaults to NCCL when
    CUDA is available, gloo otherwise. Returns this rank's result.
    """
    missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
    if missing:
        raise RuntimeError(f"run_torchrun_rank needs torchrun's environment; missing {', '.join(missing)}")
    world_size = int(os.environ["WORLD_SIZE"])
    if layout is not None and layout.world_size != world_size:
        raise ValueError(f"{layout} has world size {layout.world_size}, torchrun started {world_size}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    owns_group = not dist.is_initialized()
    if owns_group:
        dist.init_process_group(backend, init_method="env://")
    try:
        ctx = RankContext(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            layout=layout,
            device=device,
            groups=build_groups(layout),
            extras={"backend": backend},
        )
        return fn(ctx, *args, **(kwargs or {}))
    finally:
        if owns_group:
            dist.destroy_process_group()
