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
from .device_api import _TORCH, emulation


def _deferring(name: str, emulated: Callable[..., Any]) -> Callable[..., Any]:
    def replacement(*args: Any, **kwargs: Any) -> Any:
        if emulation() is None:
            return _TORCH[name](*args, **kwargs)
        return emulated(*args, **kwargs)

    replacement.__name__ = replacement.__qualname__ = name
    replacement.__doc__ = f"torch.cuda.{name}, emulated in the ranks of runs with cuda='emulate'."
    return replacement


def _either(name: str, emulated: type) -> type:
    """A class standing for torch's ``name`` and its emulated twin."""

    class Meta(type):
        def __instancecheck__(cls, obj: object) -> bool:
            return isinstance(obj, (emulated, _TORCH[name]))

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        if emulation() is None:
            return _TORCH[name](*args, **kwargs)
        return emulated(*args, **kwargs)

    return Meta(
        name, (), {"__new__": __new__, "__module__": "simdist._cuda.patch", "__doc__": emulated.__doc__}
    )


def _stream_context(stream: Any) -> Any:
    """``torch.cuda.stream(s)``: ``s`` is the rank's current stream inside the block."""
    if stream is None:
        return contextlib.nullcontext()
    return stream


# What an emulated device cannot do, refused with the reason instead of
# torch's "Torch not compiled with CUDA enabled" from deep inside.
_REFUSED = {
    "graph": "CUDA graphs capture GPU kernels",
    "CUDAGraph": "CUDA graphs capture GPU kernels",
    "make_graphed_callables": "CUDA graphs capture GPU kernels",
    "graph_pool_handle": "CUDA graphs capture GPU kernels",
    "utilization": "NVML reports a real GPU's state",
    "memory_usage": "NVML reports a real GPU's state",
    "temperature": "NVML reports a real GPU's state",
    "power_draw": "NVML reports a real GPU's state",
    "clock_rate": "NVML reports a real GPU's state",
}


def _refusing(name: str, why: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        if emulation() is None:
            return _TORCH[name](*args, **kwargs)
        raise UnsupportedOperationError(
            f"torch.cuda.{name}: not available on simdist's emulated CUDA devices ({why}); "
            "run this test on a GPU (mark it gpu), see docs/cuda.md"
        )

    refused.__name__ = refused.__qualname__ = name
    if isinstance(_TORCH_CUDA_OWN.get(name), type):
        # A class (CUDAGraph): still one for isinstance, refused when made.
        class Meta(type):
            def __instancecheck__(cls, obj: object) -> bool:
                return isinstance(obj, _TORCH[name])

        return Meta(name, (), {"__new__": lambda cls, *a, **k: refused(*a, **k), "__doc__": why})
    return refused


_TORCH_CUDA_OWN = {name: getattr(torch.cuda, name, None) for name in _REFUSED}


REPLACED: dict[str, Any] = {
    "is_available": device_api.is_available,
    "device_count": device_api.device_count,
    "is_initialized": device_api.is_initialized,
    "init": device_api.init,
    "current_device": device_api.current_device,
    "set_device": device_api.set_device,
    "get_device_name": device_api.get_device_name,
    "get_device_properties": device_api.get_device_properties,
    "get_device_capability": device_api.get_device_capability,
    "synchronize": device_api.synchronize,
    "device": device_api.device,
    "Stream": _either("Stream", streams.EmulatedStream),
    "Event": _either("Event", streams.EmulatedEvent),
    "current_stream": _deferring("current_stream", streams.current_stream),
    "default_stream": _deferring("default_stream", streams.default_stream),
    "set_stream": _deferring("set_stream", streams.set_stream),
    "stream": _deferring("stream", _stream_context),
    **{name: _deferring(name, fn) for name, fn in generators.REPLACEMENTS.items()},
    **{name: _deferring(name, fn) for name, fn in memory.REPLACEMENTS.items() if hasattr(torch.cuda, name)},
    **{name: _refusing(name, why) for name, why in _REFUSED.items() if hasattr(torch.cuda, name)},
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
_ENGINE: list[Callable[..., Any]] = []


def _run_backward(*args: Any, **kwargs: Any) -> Any:
    from .mode import EmulatedCudaMode

    engine = _ENGINE[-1]
    if emulation() is None or any(
        isinstance(m, EmulatedCudaMode) for m in torch.overrides._get_current_function_mode_stack()
    ):
        return engine(*args, **kwargs)
    with torch._C._EnableTorchFunction(), EmulatedCudaMode():
        return engine(*args, **kwargs)


# NCCL, as a node's ranks see it: available, and a version for c10d's error
# logger (which asks for it when a call on an "nccl" group raises), so a
# group asked for with backend="nccl" reports that name (_isolation.c10d_state).
EMULATED_NCCL_VERSION = (2, 21, 5)


def _nccl_available() -> bool:
    return True if emulation() is not None else bool(_NCCL["is_nccl_available"]())


def _nccl_version() -> Any:
    return EMULATED_NCCL_VERSION if emulation() is not None else _NCCL["version"]()


# torch.autocast("cuda") sets CUDA's autocast state, which casts only CUDA
# tensors: on emulated (CPU) tensors it would silently compute in float32.
# In an emulating rank it also enters CPU autocast with the same dtype, whose
# lists cast the ops that matter alike (matmul, mm, bmm, addmm, baddbmm,
# linear, conv, scaled_dot_product_attention to the low precision); where
# the two lists differ, the CPU's decides (docs/cuda.md).
_AUTOCAST: dict[str, Any] = {}
_Autocast = torch.amp.autocast_mode.autocast


def _autocast_enter(self: Any) -> Any:
    result = _AUTOCAST["__enter__"](self)
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
    return _AUTOCAST["__exit__"](self, *exc)


def _default_timeout(backend: Any) -> Any:
    # torch warns "NCCL support is not compiled" and returns the default
    # timeout; where NCCL is emulated the warning would only mislead.
    c10d = torch.distributed.distributed_c10d
    if emulation() is not None and backend == c10d.Backend.NCCL:
        return c10d.default_pg_timeout
    return _NCCL["_get_default_timeout"](backend)


# A storage resized in place (FSDP2 frees and re-allocates its unsharded
# parameters with ``untyped_storage().resize_``) gets new memory without an
# op the dispatch mode sees: the stream rules forget both addresses, as CSAN
# hears of the free and the allocation from the caching allocator.
_STORAGE: dict[str, Any] = {}


def _resize_storage(self: Any, size: int) -> Any:
    from .streams import rank_order

    emulating = emulation() is not None
    order = rank_order() if emulating else None
    before = self.data_ptr() if order is not None else 0
    result = _STORAGE["resize_"](self, size)
    if emulating:
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
_COMPILE: dict[str, Any] = {}
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _compile(*args: Any, **kwargs: Any) -> Any:
    if emulation() is not None:
        mode, options = kwargs.get("mode"), kwargs.get("options") or {}
        if mode in _CUDA_GRAPH_MODES or options.get("triton.cudagraphs"):
            asked = f"mode={mode!r}" if mode in _CUDA_GRAPH_MODES else "options={'triton.cudagraphs': True}"
            raise UnsupportedOperationError(
                f"torch.compile({asked}): not available on simdist's emulated CUDA devices (it captures "
                "CUDA graphs of GPU kernels); the default mode compiles for the CPU the emulated "
                "tensors live on. Run this test on a GPU (mark it gpu), see docs/cuda.md"
            )
    return _COMPILE["compile"](*args, **kwargs)


# Triton kernels launch through Triton's own driver, which finds no GPU on
# this machine and says so from deep inside: in an emulating rank a launch is
# refused by name. Triton is optional: patched only where it is installed
# (imported then, so that a rank importing it later meets the patch too).
_TRITON: dict[str, Any] = {}


def _triton_jit() -> Any:
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        import triton.runtime.jit
    except Exception:  # a Triton that cannot load cannot launch either
        return None
    return triton.runtime.jit.JITFunction


def _triton_run(self: Any, *args: Any, **kwargs: Any) -> Any:
    if emulation() is not None:
        raise UnsupportedOperationError(
            f"a Triton kernel ({getattr(self, '__name__', self)}): not available on simdist's emulated "
            "CUDA devices (Triton compiles GPU kernels); run this test on a GPU (mark it gpu), "
            "see docs/cuda.md"
        )
    return _TRITON["run"](self, *args, **kwargs)


_NCCL: dict[str, Any] = {}
_NCCL_PLACES = (
    (torch.distributed, "is_nccl_available", _nccl_available),
    (torch.distributed.distributed_c10d, "is_nccl_available", _nccl_available),
    (torch.distributed.distributed_c10d, "_get_default_timeout", _default_timeout),
    (torch.cuda.nccl, "version", _nccl_version),
)


def _install() -> None:
    for name, replacement in REPLACED.items():
        _TORCH[name] = getattr(torch.cuda, name)
        setattr(torch.cuda, name, replacement)
    for owner, name, replacement in _NCCL_PLACES:
        _NCCL.setdefault(name, getattr(owner, name))
        setattr(owner, name, replacement)
    for name, replacement in (("__enter__", _autocast_enter), ("__exit__", _autocast_exit)):
        _AUTOCAST[name] = _Autocast.__dict__[name]
        setattr(_Autocast, name, replacement)
    jit = _triton_jit()
    if jit is not None:
        _TRITON["run"], _TRITON["class"] = jit.run, jit
        jit.run = _triton_run
    _COMPILE["compile"] = torch.compile
    torch.compile = _compile  # refuses CUDA graphs in emulating ranks
    _STORAGE["resize_"] = torch.UntypedStorage.resize_
    torch.UntypedStorage.resize_ = _resize_storage  # type: ignore[method-assign]  # an emulating rank's storages
    _ENGINE.append(torch.autograd.graph._engine_run_backward)
    torch.autograd.graph._engine_run_backward = _run_backward
    torch.autograd._engine_run_backward = _run_backward  # its own import of it


def _uninstall() -> None:
    for name in REPLACED:
        if name in _TORCH:
            setattr(torch.cuda, name, _TORCH.pop(name))
    for owner, name, _ in _NCCL_PLACES:
        if name in _NCCL:
            setattr(owner, name, _NCCL[name])
    _NCCL.clear()
    for name in ("__enter__", "__exit__"):
        if name in _AUTOCAST:
            setattr(_Autocast, name, _AUTOCAST.pop(name))
    if "run" in _TRITON:
        _TRITON["class"].run = _TRITON.pop("run")
        _TRITON.clear()
    if "compile" in _COMPILE:
        torch.compile = _COMPILE.pop("compile")
    if "resize_" in _STORAGE:
        del torch.UntypedStorage.resize_  # the class's own (StorageBase's) again
        _STORAGE.clear()
    if _ENGINE:
        engine = _ENGINE.pop()
        torch.autograd.graph._engine_run_backward = engine
        torch.autograd._engine_run_backward = engine  # its own import of it


patches.register(
    "cuda emulation",
    _install,
    _uninstall,
    [
        *((torch.cuda, name) for name in REPLACED),
        *((owner, name) for owner, name, _ in _NCCL_PLACES),
        (_Autocast, "__enter__"),
        (_Autocast, "__exit__"),
        (torch.UntypedStorage, "resize_"),
        (torch, "compile"),
        (torch.autograd.graph, "_engine_run_backward"),
        (torch.autograd, "_engine_run_backward"),
    ],
)
