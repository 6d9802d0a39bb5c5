"""Tensors on an emulated CUDA device: CPU storage that answers as ``cuda:N``.

An ``EmulatedCudaTensor`` is a CPU tensor (its storage, its kernels, its
autograd) whose Python view reports the device a GPU run would give it
(docs/cuda.md). It is a ``__torch_function__`` subclass, not a dispatch-level
wrapper: a wrapper subclass whose C++ device is ``cuda`` aborts the process on
a CPU build of torch as soon as autograd records it (autograd asks the
device's guard for a stream, and a CPU build has none), so the device is
answered in Python and the C++ side keeps seeing CPU tensors.

The rules a GPU enforces that a CPU cannot see (device mismatches, NumPy
views) are applied here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from . import device_api, memory, streams

_TensorBase = torch._C.TensorBase


def leaves(value: Any) -> list[Any]:
    """The leaves of an op's arguments or results: tensors sit in tuples,
    lists and dicts only (torch's pytree, which knows every registered node
    type, cost most of an emulated op)."""
    out: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (tuple, list)):
            stack.extend(reversed(item))  # in order: the first tensor names the device in errors
        elif isinstance(item, dict):
            stack.extend(reversed(item.values()))
        else:
            out.append(item)
    return out


def _map_tensors(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list):
        return [_map_tensors(fn, item) for item in value]
    if isinstance(value, tuple):
        mapped = tuple(_map_tensors(fn, item) for item in value)
        return type(value)(*mapped) if hasattr(value, "_fields") else mapped  # a named tuple keeps its type
    if isinstance(value, dict):
        return {key: _map_tensors(fn, item) for key, item in value.items()}
    return value


# Property getters reach __torch_function__ as the descriptor's __get__, a new
# method-wrapper object at every access: they are told apart by the descriptor.
_DEVICE, _IS_CUDA, _IS_CPU, _DATA, _GRAD = (
    _TensorBase.__dict__[name] for name in ("device", "is_cuda", "is_cpu", "data", "grad")
)

# Ops that a GPU allows across devices.
_CROSS_DEVICE: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.Tensor.copy_,
        torch.Tensor.__getitem__,
        torch.Tensor.__setitem__,
        torch.Tensor.set_,
        torch._has_compatible_shallow_copy_type,
    }
)


class EmulatedCudaTensor(torch.Tensor):
    """A CPU tensor that reports the emulated CUDA device ``cuda:{_cuda_index}``."""

    _cuda_index: int = 0

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return handle(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]  # torch stubs name no keyword
        # torch's printer, which reads the device through this class (so it
        # adds device='cuda:N' where a GPU tensor has it) but names the class:
        # the prefix is put back to a plain tensor's, its indent with it.
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        own = f"{type(self).__name__}("
        if isinstance(self, torch.nn.Parameter) and text.startswith("Parameter(" + own):
            text = text[len("Parameter(") : -1]
        if text.startswith(own):
            text = "tensor(" + text[len(own) :].replace("\n" + " " * len(own), "\n" + " " * len("tensor("))
        if isinstance(self, torch.nn.Parameter):
            return "Parameter containing:\n" + text
        return text

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        # torch's own deep copy asks new_empty() for the subclass, which the
        # CPU side answers with a plain tensor: copied here, device kept.
        if id(self) in memo:
            return memo[id(self)]
        copied = rebuild(*self._rebuild_args())
        memo[id(self)] = copied
        grad = _GRAD.__get__(self)  # the descriptor's own getter
        if grad is not None:
            copied.grad = copy.deepcopy(grad, memo)
        return copied

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Saved with its device, loaded back onto it (as torch.save keeps a
        # CUDA tensor's location); ``rebuild`` is on torch.load's safe list.
        return (rebuild, self._rebuild_args())

    def _rebuild_args(self) -> tuple[torch.Tensor, int, bool, bool]:
        with torch._C.DisableTorchFunctionSubclass():
            data = host(torch.Tensor.clone(torch.Tensor.detach(self)))
        return (data, self._cuda_index, self.requires_grad, isinstance(self, torch.nn.Parameter))


def rebuild(data: torch.Tensor, index: int, requires_grad: bool, parameter: bool) -> torch.Tensor:
    """An emulated tensor on ``cuda:index`` holding ``data`` (a plain CPU tensor)."""
    if parameter:
        return emulated(torch.nn.Parameter(data, requires_grad=requires_grad), index)
    return emulated(data.requires_grad_(requires_grad), index)


torch.serialization.add_safe_globals([rebuild])


class EmulatedCudaParameter(EmulatedCudaTensor, torch.nn.Parameter):
    """An ``nn.Parameter`` moved to the emulated device (``module.cuda()``)."""


def emulated(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """``tensor`` itself, now reported on ``cuda:index``.

    The object's class changes in place: an alias (``as_subclass``) would put
    an AliasBackward node after every op and make a leaf made with
    ``requires_grad=True`` a non-leaf whose ``.grad`` is never filled."""
    if not _become(tensor, index):
        return tensor  # another subclass keeps its own type (and its own device story)
    memory.tensor_made(tensor, index)
    return tensor


def _become(tensor: torch.Tensor, index: int) -> bool:
    """``tensor``, a plain tensor or parameter, reports ``cuda:index`` from now
    on (its class changed in place); False for another subclass."""
    if type(tensor) is torch.Tensor:
        tensor.__class__ = EmulatedCudaTensor
    elif type(tensor) is torch.nn.Parameter:
        tensor.__class__ = EmulatedCudaParameter
    elif not isinstance(tensor, EmulatedCudaTensor):
        return False
    tensor._cuda_index = index  # type: ignore[attr-defined]
    return True


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU tensor an emulated one is (shared storage); others unchanged."""
    if isinstance(tensor, EmulatedCudaTensor):
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.as_subclass(tensor, torch.Tensor)
    return tensor


def index_of(tensor: object) -> int | None:
    """The emulated device index of ``tensor``, None when it is not emulated."""
    return tensor._cuda_index if isinstance(tensor, EmulatedCudaTensor) else None


def mismatch(first: str, second: str) -> RuntimeError:
    # torch's own wording (ATen's device check), so that code matching it matches ours.
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"
    )


def _check_devices(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The one emulated index the op's tensors share; raises torch's error otherwise."""
    index: int | None = None
    cpu = False
    for leaf in leaves((args, kwargs)):
        if isinstance(leaf, EmulatedCudaTensor):
            if index is None:
                index = leaf._cuda_index
            elif leaf._cuda_index != index and func not in _CROSS_DEVICE:
                raise mismatch(f"cuda:{index}", f"cuda:{leaf._cuda_index}")
        elif isinstance(leaf, torch.Tensor) and leaf.dim() > 0 and leaf.device.type == "cpu":
            cpu = True
    assert index is not None  # handle() runs because an argument is emulated
    if cpu and func not in _CROSS_DEVICE:
        raise mismatch(f"cuda:{index}", "cpu")
    return index


def _wrap_outputs(result: Any, index: int, inputs: Any = (), given_leaves: list[Any] | None = None) -> Any:
    """Tensors the op made, reported on ``cuda:index``; a CPU tensor it was
    given and returns (an in-place op's own argument) stays the caller's.
    ``given_leaves``: the inputs' leaves, when the caller has them already."""
    if isinstance(result, torch.Tensor) and type(result) is not torch.Tensor:
        return result  # already emulated (the dispatch mode made it so), or another kind
    if result is None:
        return result
    found = leaves(inputs) if given_leaves is None else given_leaves
    given = {id(leaf) for leaf in found if isinstance(leaf, torch.Tensor)}

    def wrap(value: Any) -> Any:
        if type(value) is torch.Tensor and id(value) not in given:
            return emulated(value, index)
        return value

    return _map_tensors(wrap, result)


def handle(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` called on arguments of which at least one is emulated."""
    owner = getattr(func, "__self__", None)
    if owner is _DEVICE:
        return torch.device("cuda", args[0]._cuda_index)
    if owner is _IS_CUDA:
        return True
    if owner is _IS_CPU:
        return False
    if func is torch.Tensor.get_device:
        return args[0]._cuda_index
    if func is torch.Tensor.type and len(args) == 1 and not kwargs:
        with torch._C.DisableTorchFunctionSubclass():
            name = torch.Tensor.type(args[0])
        return name.replace("torch.", "torch.cuda.", 1)
    if func is torch.Tensor.numpy or func is torch.Tensor.__array__:
        raise TypeError(
            f"can't convert cuda:{args[0]._cuda_index} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )
    if func is torch.Tensor.record_stream:
        # One rank's streams run in program order: nothing to keep alive, but
        # the free is checked against the streams named (memory.py).
        memory.record_stream(args[0], args[1] if len(args) > 1 else kwargs.get("stream"))
        return None
    if func is torch.Tensor.__format__:
        return plain(args[0]).__format__(*args[1:])  # a scalar formats as its value
    if func is torch.Tensor.cpu:
        return _to_cpu(args[0], kwargs.get("memory_format", torch.preserve_format))
    if func is torch.Tensor.cuda:
        return move(args[0], _cuda_target(args[1] if len(args) > 1 else kwargs.get("device")))
    if func is torch.Tensor.to:
        return to(args[0], *args[1:], **kwargs)
    if owner is _DATA and getattr(func, "__name__", "") == "__set__":
        return set_data(args[0], args[1])
    index = _check_devices(func, args, kwargs)
    with torch._C.DisableTorchFunctionSubclass():
        result = func(*args, **kwargs)
    device = kwargs.get("device")
    if device is not None:
        # The op names where its result goes (``zeros_like(x, device="cpu")``,
        # ``aten._to_copy(x, device=...)``): there, not the inputs' device.
        target = cuda_index(device)
        return host(result) if target is None and isinstance(result, torch.Tensor) else result
    return _wrap_outputs(result, index, (args, kwargs))


# ------------------------------------------------------------ moving devices


def cuda_index(device: Any) -> int | None:
    """The emulated index ``device`` names, None when it names no CUDA device."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return device  # a bare index means a CUDA device in torch's factories
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError):
        return None
    if dev.type != "cuda":
        return None
    return device_api.current_index() if dev.index is None else dev.index


def _cuda_target(device: Any) -> int:
    index = cuda_index(device)
    return device_api.current_index() if index is None else index


def _to_cpu(tensor: torch.Tensor, memory_format: torch.memory_format) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        # A copy, as a device-to-host copy is: never the emulated tensor's storage.
        copied = host(torch.Tensor.clone(tensor, memory_format=memory_format))
    _host_waited(tensor)
    return copied


def _host_waited(tensor: torch.Tensor) -> None:
    """A blocking device-to-host copy: the host waits for the copying stream."""
    if isinstance(tensor, EmulatedCudaTensor):
        streams.host_waits(tensor._cuda_index)


def host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (made by an op on emulated tensors, so reported on the
    device) back on the host: its class is put back in place."""
    if type(tensor) is EmulatedCudaTensor:
        tensor.__class__ = torch.Tensor  # type: ignore[assignment]  # back to the plain class, in place
    return tensor


def move(tensor: torch.Tensor, index: int) -> torch.Tensor:
    """``tensor.cuda(index)``: itself when already there, else a copy on ``cuda:index``."""
    if isinstance(tensor, EmulatedCudaTensor) and tensor._cuda_index == index:
        return tensor
    with torch._C.DisableTorchFunctionSubclass():
        moved = torch.Tensor.clone(tensor)
    return emulated(moved, index)


def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.to`` with a CUDA target (or from an emulated tensor)."""
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    copy = bool(kwargs.get("copy", False))
    source = index_of(tensor)
    target = cuda_index(device) if device is not None else source
    options: dict[str, Any] = {"copy": copy or (target != source)}
    if dtype is not None:
        options["dtype"] = dtype
    if memory_format is not None:
        options["memory_format"] = memory_format
    with torch._C.DisableTorchFunctionSubclass():
        out = torch.Tensor.to(tensor, **options)
    if out is tensor:
        return tensor  # nothing to do: the very tensor, as torch returns it
    if target is None:
        if not non_blocking:
            _host_waited(tensor)
        return host(out)  # a CPU copy
    return emulated(out, target)


def set_data(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """``tensor.data = value``: ``tensor`` reports ``value``'s device afterwards."""
    with torch._C.DisableTorchFunctionSubclass():
        _DATA.__set__(tensor, value)
    index = index_of(value)
    if index is not None:
        _become(tensor, index)  # in place: optimizers and modules hold this very object
    elif isinstance(tensor, EmulatedCudaTensor):
        back = torch.nn.Parameter if isinstance(tensor, EmulatedCudaParameter) else torch.Tensor
        tensor.__class__ = back  # type: ignore[assignment]  # back to the plain class, in place
