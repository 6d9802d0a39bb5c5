"""The ``cuda emulation`` patch: ``torch.cuda``'s names rebound while emulating runs are in progress.

Each replacement asks who calls: a thread of an emulating run gets the
emulated answer (``device_api``, ``streams``), every other thread torch's own
function. ``torch.cuda.Stream`` and ``Event`` become classes whose
construction decides the same way and for which ``isinstance`` accepts both
kinds, so code that checks ``isinstance(s, torch.cuda.Stream)`` keeps working.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
import torch.amp.autocast_mode
import torch.autograd.graph
import torch.cuda
import torch.cuda.nccl
import torch.distributed
import torch.distributed.distributed_c10d
import torch.overrides

from .._isolation import patches
from ..errors import UnsupportedOperationError
from . import device_api, generators, memory, streams
from .device_api import ORIGINAL, emulation, original


def _deferring(name: str, emulated: Callable[..., Any], owner: Any = torch.cuda) -> Callable[..., Any]:
    """``owner.name`` that calls ``emulated`` in an emulating rank, torch's own elsewhere."""

    def replacement(*args: Any, **kwargs: Any) -> Any:
        if emulation() is None:
            return original(owner, name)(*args, **kwargs)
        return emulated(*args, **kwargs)

    replacement.__name__ = replacement.__qualname__ = name
    replacement.__doc__ = f"{owner.__name__}.{name}, emulated in the ranks of runs with cuda='emulate'."
    return replacement


def _either(name: str, emulated: Callable[..., Any]) -> type:
    """A class standing for torch's ``name`` and its emulated twin (a class, or
    a function that refuses)."""

    class Meta(type):
        def __instancecheck__(cls, obj: object) -> bool:
            twin = (emulated,) if isinstance(emulated, type) else ()
            return isinstance(obj, (*twin, original(torch.cuda, name)))

    made = _deferring(name, emulated)
    return Meta(
        name,
        (),
        {
            "__new__": lambda cls, *args, **kwargs: made(*args, **kwargs),
            "__module__": "simdist._cuda.patch",
            "__doc__": emulated.__doc__,
        },
    )


def _stream_context(stream: Any) -> Any:
    """``torch.cuda.stream(s)``: ``s`` is the rank's current stream inside the block."""
    if stream is None:
        return contextlib.nullcontext()
    return stream


def _true() -> bool:
    return True


def _init() -> None:
    """Nothing to initialise on an emulated device."""


# What an emulated device cannot do, refused with the reason instead of
# torch's "Torch not compiled with CUDA enabled" from deep inside.
_GRAPHS = "CUDA graphs capture GPU kernels"
_NVML = "NVML reports a real GPU's state"
_REFUSED = {
    "graph": _GRAPHS,
    "CUDAGraph": _GRAPHS,
    "make_graphed_callables": _GRAPHS,
    "graph_pool_handle": _GRAPHS,
    "utilization": _NVML,
    "memory_usage": _NVML,
    "temperature": _NVML,
    "power_draw": _NVML,
    "clock_rate": _NVML,
}


def _refusing(name: str, why: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOperationError(
            f"torch.cuda.{name}: not available on simdist's emulated CUDA devices ({why}); "
            "run this test on a GPU (mark it gpu), see docs/cuda.md"
        )

    refused.__doc__ = why
    if isinstance(getattr(torch.cuda, name), type):
        return _either(name, refused)  # a class (CUDAGraph): still one for isinstance, refused when made
    return _deferring(name, refused)


# What torch.cuda's functions answer in an emulating rank (torch's own elsewhere).
_EMULATED: dict[str, Callable[..., Any]] = {
    "is_available": _true,
    "device_count": device_api.device_count,
    "is_initialized": _true,
    "init": _init,
    "current_device": device_api.current_index,
    "set_device": device_api.set_device,
    "get_device_name": device_api.get_device_name,
    "get_device_properties": device_api.get_device_properties,
    "get_device_capability": device_api.get_device_capability,
    "synchronize": device_api.synchronize,
    "current_stream": streams.current_stream,
    "default_stream": streams.default_stream,
    "set_stream": streams.set_stream,
    "stream": _stream_context,
    **generators.REPLACEMENTS,
    **{name: fn for name, fn in memory.REPLACEMENTS.items() if hasattr(torch.cuda, name)},
}


# Backward entered through ``Tensor.backward`` or ``autograd.grad`` runs
# inside the function mode's and the emulated tensor's own handlers, where
# torch has taken both off (so that they do not see their own call again):
# the engine would run every backward node without them, so a custom
# Function's ``torch.empty(..., device=torch.cuda.current_device())`` would
# reach the CPU build's CUDA, and an emulated tensor would report ``cpu``
# (FSDP2 picks its stream API by ``tensor.device``). The engine's entry puts
# both back for the rank that emulates. (The dispatch mode stays on
# throughout, and runs the aten ops below it with both off.)
def _run_backward(*args: Any, **kwargs: Any) -> Any:
    from .mode import EmulatedCudaMode

    engine = original(torch.autograd.graph, "_engine_run_backward")
    if any(isinstance(m, EmulatedCudaMode) for m in torch.overrides._get_current_function_mode_stack()):
        return engine(*args, **kwargs)
    with torch._C._EnableTorchFunction(), EmulatedCudaMode():
        return engine(*args, **kwargs)


# NCCL, as a node's ranks see it: available, and a version for c10d's error
# logger (which asks for it when a call on an "nccl" group raises), so a
# group asked for with backend="nccl" reports that name (_isolation.c10d_state).
EMULATED_NCCL_VERSION = (2, 21, 5)


def _nccl_version() -> Any:
    return EMULATED_NCCL_VERSION


# torch.autocast("cuda") sets CUDA's autocast state, which casts only CUDA
# tensors: on emulated (CPU) tensors it would silently compute in float32.
# In an emulating rank it also enters CPU autocast with the same dtype, whose
# lists cast the ops that matter alike (matmul, mm, bmm, addmm, baddbmm,
# linear, conv, scaled_dot_product_attention to the low precision); where
# the two lists differ, the CPU's decides (docs/cuda.md).
_Autocast = torch.amp.autocast_mode.autocast


def _autocast_enter(self: Any) -> Any:
    result = original(_Autocast, "__enter__")(self)
    if self.device == "cuda" and emulation() is not None:
        cpu = _Autocast(
            "cpu", dtype=self.fast_dtype, enabled=self._enabled, cache_enabled=self._cache_enabled
        )
        cpu.__enter__()
        self._simdist_cpu_autocast = cpu
    return result


def _autocast_exit(self: Any, *exc: Any) -> Any:
    cpu = self.__dict__.pop("_simdist_cpu_autocast", None)
    if cpu is not None:
        cpu.__exit__(*exc)
    return original(_Autocast, "__exit__")(self, *exc)


_C10D = torch.distributed.distributed_c10d


def _default_timeout(backend: Any) -> Any:
    # torch warns "NCCL support is not compiled" and returns the default
    # timeout; where NCCL is emulated the warning would only mislead.
    if backend == _C10D.Backend.NCCL:
        return _C10D.default_pg_timeout
    return original(_C10D, "_get_default_timeout")(backend)


# A storage resized in place (FSDP2 frees and re-allocates its unsharded
# parameters with ``untyped_storage().resize_``) gets new memory without an
# op the dispatch mode sees: the stream rules forget both addresses, as CSAN
# hears of the free and the allocation from the caching allocator.
def _resize_storage(self: Any, size: int) -> Any:
    order = streams.rank_order()
    before = self.data_ptr() if order is not None else 0
    result = original(torch.UntypedStorage, "resize_")(self, size)
    memory.resized(self)
    if order is not None:
        order.forget(before)
        order.forget(self.data_ptr())
    return result


# torch.compile: its default (inductor) compiles an emulated rank's code for
# the CPU the tensors really live on, which computes the program's values.
# What only a GPU has is refused: CUDA graphs ("reduce-overhead",
# "max-autotune", the "triton.cudagraphs" option), where the CPU backend
# would silently leave them out.
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _compile(*args: Any, **kwargs: Any) -> Any:
    mode, options = kwargs.get("mode"), kwargs.get("options") or {}
    if mode in _CUDA_GRAPH_MODES or options.get("triton.cudagraphs"):
        asked = f"mode={mode!r}" if mode in _CUDA_GRAPH_MODES else "options={'triton.cudagraphs': True}"
        raise UnsupportedOperationError(
            f"torch.compile({asked}): not available on simdist's emulated CUDA devices (it captures "
            "CUDA graphs of GPU kernels); the default mode compiles for the CPU the emulated "
            "tensors live on. Run this test on a GPU (mark it gpu), see docs/cuda.md"
        )
    return original(torch, "compile")(*args, **kwargs)


# Triton kernels launch through Triton's own driver, which finds no GPU on
# this machine and says so from deep inside: in an emulating rank a launch is
# refused by name. Triton is optional: patched only where it is installed
# (imported then, so that a rank importing it later meets the patch too).
def _triton_jit() -> Any:
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton.runtime.jit
    except Exception:  # a Triton that cannot load cannot launch either
        return None
    return triton.runtime.jit.JITFunction


def _triton_run(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise UnsupportedOperationError(
        f"a Triton kernel ({getattr(self, '__name__', self)}): not available on simdist's emulated "
        "CUDA devices (Triton compiles GPU kernels); run this test on a GPU (mark it gpu), "
        "see docs/cuda.md"
    )


# Every place the patch rebinds, with what it puts there; each replacement
# defers to what it replaced outside emulating ranks.
_PLACES: list[tuple[Any, str, Any]] = [
    (torch.cuda, "device", device_api.device),
    (torch.cuda, "Stream", _either("Stream", streams.EmulatedStream)),
    (torch.cuda, "Event", _either("Event", streams.EmulatedEvent)),
    *((torch.cuda, name, _deferring(name, fn)) for name, fn in _EMULATED.items()),
    *(
        (torch.cuda, name, _refusing(name, why))
        for name, why in _REFUSED.items()
        if hasattr(torch.cuda, name)
    ),
    *(
        (owner, name, _deferring(name, emulated, owner))
        for owner, name, emulated in (
            (torch.distributed, "is_nccl_available", _true),
            (_C10D, "is_nccl_available", _true),
            (_C10D, "_get_default_timeout", _default_timeout),
            (torch.cuda.nccl, "version", _nccl_version),
            (torch, "compile", _compile),  # refuses CUDA graphs in emulating ranks
            (torch.UntypedStorage, "resize_", _resize_storage),  # an emulating rank's storages
            (torch.autograd.graph, "_engine_run_backward", _run_backward),
            (torch.autograd, "_engine_run_backward", _run_backward),  # its own import of it
        )
    ),
    (_Autocast, "__enter__", _autocast_enter),
    (_Autocast, "__exit__", _autocast_exit),
]
_INSTALLED: list[tuple[Any, str, bool]] = []  # each place, and whether the attribute was its own


def _install() -> None:
    jit = _triton_jit()
    triton = [] if jit is None else [(jit, "run", _deferring("run", _triton_run, jit))]
    for owner, name, replacement in [*_PLACES, *triton]:
        ORIGINAL[owner, name] = getattr(owner, name)
        _INSTALLED.append((owner, name, name in vars(owner)))
        setattr(owner, name, replacement)


def _uninstall() -> None:
    while _INSTALLED:
        owner, name, own = _INSTALLED.pop()
        if own:
            setattr(owner, name, ORIGINAL.pop((owner, name)))
        else:
            delattr(owner, name)  # the class's inherited one again (StorageBase's resize_)
            del ORIGINAL[owner, name]


patches.register("cuda emulation", _install, _uninstall, [(owner, name) for owner, name, _ in _PLACES])
