"""Letting TorchDispatchModes (``CommDebugMode``) see the c10d ops a real backend dispatches.

A Python process group is called directly, past the dispatcher (c10d has no
Python ``Backend``), so while a mode is active each call is also made on a
shadow C++ group whose backend is c10d's ``FakeProcessGroup`` (it touches no
data); see docs/never-hang.md. With no mode active this costs one C call.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch._C import _len_torch_dispatch_stack

# Modes other than the collective sanitizer's: it judges simdist's calls itself.
from .._sanitizer import other_modes_active as modes_active

__all__ = ["show"]

# simdist's method -> (the ProcessGroup method gloo's path takes, its default options)
_SAME_AS: dict[str, tuple[str, Any]] = {
    "allreduce": ("allreduce", _c10d.AllreduceOptions),
    "allreduce_coalesced": ("allreduce_coalesced", _c10d.AllreduceCoalescedOptions),
    "broadcast": ("broadcast", _c10d.BroadcastOptions),
    "reduce": ("reduce", _c10d.ReduceOptions),
    "allgather": ("allgather", _c10d.AllgatherOptions),
    "all_gather_single": ("_allgather_base", _c10d.AllgatherOptions),
    "reduce_scatter": ("reduce_scatter", _c10d.ReduceScatterOptions),
    "reduce_scatter_single": ("_reduce_scatter_base", _c10d.ReduceScatterOptions),
    "gather": ("gather", _c10d.GatherOptions),
    "scatter": ("scatter", _c10d.ScatterOptions),
    "alltoall": ("alltoall", _c10d.AllToAllOptions),
    "all_to_all_single": ("alltoall_base", _c10d.AllToAllOptions),
    "barrier": ("barrier", _c10d.BarrierOptions),
    "allgather_into_tensor_coalesced": ("allgather_into_tensor_coalesced", _c10d.AllgatherOptions),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", _c10d.ReduceScatterOptions),
}


def _shadow(group: Any) -> dist.ProcessGroup:
    shadow = group.__dict__.get("_simdist_shadow")
    if shadow is None:
        rank, size = group.rank(), group.size()
        shadow = dist.ProcessGroup(rank, size)  # type: ignore[call-arg]  # (rank, size) exists on 2.13; the stub lists only (store, rank, size)
        fake = _c10d.FakeProcessGroup._create_internal(rank, size)
        for device in ("cpu", "cuda"):
            shadow._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, fake)
        shadow._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        group.__dict__["_simdist_shadow"] = shadow
    return shadow


def show(group: Any, method: str, *args: Any) -> None:
    """Make ``method``'s dispatcher op visible to the active modes, as gloo's path
    does (with no mode active: one C call). ``args`` are the call's arguments; a
    trailing None stands for default options."""
    if not _len_torch_dispatch_stack() or not modes_active():
        return
    name, options = _SAME_AS.get(method, (method, None))
    if args and args[-1] is None and options is not None:
        args = (*args[:-1], options())
    getattr(_shadow(group), name)(*args).wait()
