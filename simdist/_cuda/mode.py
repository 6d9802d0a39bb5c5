"""The function mode that makes ``device="cuda"`` mean the emulated device.

Entered in each rank thread of a run with ``cuda="emulate"``: a factory or
conversion that names a CUDA device (``torch.zeros(..., device="cuda")``,
``x.new_empty(..., device=0)``, ``torch.tensor(data, device="cuda:1")``,
``x.cuda()``, ``x.to("cuda")``, ``torch.set_default_device("cuda")`` which
adds that keyword itself) runs on the CPU and returns an emulated tensor; a
plain tensor whose ``.data`` is set to an emulated one (``module.cuda()``)
becomes emulated in place. Everything else passes through untouched, so the
mode costs a Python call per torch function and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

from .tensor import (
    EmulatedCudaTensor,
    _wrap_outputs,
    cuda_index,
    index_of,
    move,
    set_data,
    to,
)

_DATA = torch._C.TensorBase.__dict__["data"]


def _default_device() -> torch.device | None:
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return None if context is None else context.device


class EmulatedCudaMode(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if isinstance(first, torch.Tensor) and not isinstance(first, EmulatedCudaTensor):
            if func is torch.Tensor.cuda:
                device = args[1] if len(args) > 1 else kwargs.get("device")
                index = cuda_index("cuda" if device is None else device)
                return move(first, 0 if index is None else index)
            if func is torch.Tensor.to:
                return to(first, *args[1:], **kwargs)
            if (
                getattr(func, "__self__", None) is _DATA
                and getattr(func, "__name__", "") == "__set__"
                and index_of(args[1]) is not None
            ):
                return set_data(first, args[1])
        device = kwargs.get("device")
        if device is None and func in _device_constructors():
            # torch.set_default_device keeps its mode at the bottom of the stack,
            # under this one: its device is read here, before it would add it.
            device = _default_device()
        index = cuda_index(device) if device is not None else None
        if index is None:
            return func(*args, **kwargs)
        result = func(*args, **{**kwargs, "device": "cpu"})
        return _wrap_outputs(result, index)
