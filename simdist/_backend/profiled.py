"""gloo's profiler events for simdist's calls, in a rank's profiler session.

One asynchronous ``gloo:<op>`` event per call, with its input shapes, as
gloo's RecordFunction (PyTorch's tests count them; docs/torch-state.md), in
the session of the rank that issues it (``_isolation.profiler``). The event
spans the call's issue, not its completion. Only while some rank profiles
does a call pay more than one attribute read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from .._isolation import profiler
from .ops import IN, INS, SPARSE, TS, T, Whole

__all__ = ["as_one_call", "record"]

# simdist's op -> the name gloo's event carries after "gloo:", where the two differ
_TITLES = {
    "all_reduce_sparse": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "all_reduce",  # gloo all-reduces the whole input
    "all_to_all_single": "all_to_all",
    "recv_anysource": "recvAnySource",
}

_quiet = threading.local()  # set while one call stands for several (as_one_call)


def _inputs(payload: dict[str, Any]) -> list[torch.Tensor]:
    for key in (T, IN):
        if key in payload:
            return [payload[key]]
    for key in (TS, INS):
        if key in payload:
            return list(payload[key])
    whole = payload.get(SPARSE)
    return [whole.tensor] if isinstance(whole, Whole) else []


def record(group: Any, op: str, payload: dict[str, Any], start_ns: int) -> None:
    """One event for ``op`` (simdist's name) on ``group``, begun at ``start_ns``."""
    if getattr(_quiet, "on", False):
        return
    profiler.collective(f"{group._get_backend_name()}:{_TITLES.get(op, op)}", _inputs(payload), start_ns)


@contextmanager
def as_one_call(group: Any, title: str, inputs: Sequence[torch.Tensor], start_ns: int) -> Iterator[None]:
    """The calls made inside are one event (``all_gather_coalesced``: one
    all_gather per input, one ``gloo:all_gather`` event, as gloo names it)."""
    if not start_ns:  # nobody profiles: nothing to stand for
        yield
        return
    outer = getattr(_quiet, "on", False)
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = outer
    if not outer:
        profiler.collective(f"{group._get_backend_name()}:{title}", list(inputs), start_ns)
