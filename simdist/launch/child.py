"""The child side of ``run_processes``: one rank process, from its start to its
outcome file, and what that file holds (the parent reads it)."""

from __future__ import annotations

import datetime
import io
import os
import pickle
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..context import RankContext, build_groups
from ..layout import Layout


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


def outcome_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"outcome-{rank}.pkl")


def dumps(obj: Any) -> bytes:
    """Pickle as ``torch.save`` does: tensors sharing a storage (a view and its
    base) still share one after loading, as in each rank's deep copy of
    ``simdist.run``'s arguments; plain pickle gives each its own storage."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_protocol=5)
    return buffer.getvalue()


def loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def worker_main(
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
    outcome_file = outcome_path(workdir, rank)
    initialised = False
    try:
        fn, args, kwargs = loads(payload)
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
        _write_outcome(outcome_file, _Outcome(ok=True, value=value), rank)
    except BaseException as exc:
        _write_outcome(outcome_file, _error_outcome(exc))
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


def _write_outcome(path: str, outcome: _Outcome, rank: int = -1) -> None:
    try:
        data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        if outcome.ok:  # the body's result: its rank fails, saying why
            raise TypeError(
                f"rank {rank}'s result must be picklable to return it to the caller, "
                f"got {type(outcome.value).__name__} ({type(exc).__name__}: {exc})"
            ) from exc
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
