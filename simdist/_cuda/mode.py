"""The modes that make ``device="cuda"`` mean the emulated device (docs/cuda.md).

Entered in each rank thread of a run with ``cuda="emulate"``: the function
mode runs a factory or conversion that names a CUDA device on the CPU and
returns an emulated tensor; everything else passes through untouched, so it
costs a Python call per torch function and nothing more. The dispatch mode
gives the emulated device to what torch makes below Python.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode

from .. import stacks
from .._sanitizer.accesses import WRITE, accesses
from .._sanitizer.mode import here
from ..errors import UnsupportedOperationError
from . import device_api, generators, streams
from .ordering import storage_key
from .tensor import (
    EmulatedCudaTensor,
    _wrap_outputs,
    cuda_index,
    index_of,
    leaves,
    move,
    set_data,
    to,
)

_DATA = torch._C.TensorBase.__dict__["data"]


# CUDA autocast's float32 ops (its "fp32" list) that CPU autocast, which
# runs the emulated device's autocast (patch.py), leaves in the low
# precision: under autocast("cuda") they compute in float32, as on a GPU.
_AUTOCAST_FP32 = frozenset(
    {
        *(
            getattr(owner, name)
            for name in "softmax log_softmax norm exp log pow sum prod cumsum cumprod rsqrt".split()
            for owner in (torch, torch.Tensor)
        ),
        torch.layer_norm,
        torch.group_norm,
        torch._C._nn.softplus,
        torch._C._nn.cross_entropy_loss,
        torch._C._nn.nll_loss_nd,
        torch._C._nn.mse_loss,
        torch._C._nn.smooth_l1_loss,
    }
)


def _in_float32(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    def widened(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64:
            return value.float()
        if isinstance(value, (list, tuple)):
            return type(value)(widened(item) for item in value)
        return value

    with torch.autocast("cpu", enabled=False):
        return func(*widened(args), **{key: widened(value) for key, value in kwargs.items()})


class EmulatedCudaMode(TorchFunctionMode):
    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if (
            func in _AUTOCAST_FP32
            and torch.is_autocast_enabled("cuda")
            and any(isinstance(leaf, EmulatedCudaTensor) for leaf in leaves((args, kwargs)))
        ):
            # CUDA's autocast casts CUDA tensors only: a CPU op is left as it is.
            return _in_float32(func, args, kwargs)
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
            context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
            device = None if context is None else context.device
        index = cuda_index(device) if device is not None else None
        if index is None:
            return func(*args, **kwargs)
        cpu = {**kwargs, "device": "cpu"}
        if getattr(func, "__name__", "") in _RANDOM_FACTORIES and kwargs.get("generator") is None:
            # The aten call below names the CPU: the device's generator is chosen here.
            result = generators.drawing_on(index, lambda: func(*args, **cpu))
        else:
            result = func(*args, **cpu)
        return _wrap_outputs(result, index)


_RANDOM_FACTORIES = frozenset(
    {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal", "bernoulli"}
)


_NO_DISPATCH = torch._C._disabled_torch_dispatch_impl  # what a subclass without a dispatch of its own has


def _dispatching(types: Any) -> bool:
    """Whether a subclass with a dispatch of its own takes part, fake tensors
    aside (they hold no values; the fake mode below computes them)."""
    own = [kind for kind in types if getattr(kind, "__torch_dispatch__", _NO_DISPATCH) is not _NO_DISPATCH]
    if not own:
        return False
    module = sys.modules.get("torch._subclasses.fake_tensor")
    fake = getattr(module, "FakeTensor", None)
    return not (fake is not None and any(issubclass(kind, fake) for kind in own))


class EmulatedDeviceDispatch(TorchDispatchMode):
    """Outputs of an aten op on emulated tensors are on the same emulated device.

    The function mode sees what Python code calls; this one sees every aten
    op, including those torch runs below Python (decompositions, DTensor's
    and FSDP's ops on their local tensors, custom ops' kernels), whose
    results would otherwise come back as plain CPU tensors. A subclass with a
    dispatch of its own (DTensor) is handed back: it runs with this mode
    still on the stack, so the ops on the tensors holding its values come
    back here."""

    simdist_own_mode = True  # not shown simdist's collectives (_sanitizer.other_modes_active)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if types and _dispatching(types):
            return NotImplemented
        # Below Python: no torch function handling for what this mode does
        # itself (each tensor method call on an emulated tensor would go
        # through both handlers: most of an op's cost, measured).
        with _NO_TORCH_FUNCTION():
            return _dispatch(func, args, kwargs or {})


_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction


def _dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    given = None
    device = kwargs.get("device")
    if device is not None:
        # A factory or copy naming its device (torch code below Python
        # builds them so): CUDA means the emulated device, else as asked.
        index = cuda_index(device)
        if index is None:
            return _below_python(func, args, kwargs)
        cpu = {**kwargs, "device": torch.device("cpu")}
        result = _wrap_outputs(_run(func, args, cpu, index), index, (args, kwargs))
    else:
        given = leaves((args, kwargs))
        emulated = next((leaf for leaf in given if isinstance(leaf, EmulatedCudaTensor)), None)
        if emulated is None:
            return _below_python(func, args, kwargs)
        index = emulated._cuda_index
        result = _wrap_outputs(_run(func, args, kwargs, index), index, given_leaves=given)
    if not here.quiet and not func.namespace.startswith(_COLLECTIVES):
        _ordered(func, args, kwargs, result, index, given)
    return result


# Collectives are ordered by their Work (collectives.py), not as kernels.
_COLLECTIVES = ("c10d", "_c10d")


def _ordered(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, index: int, given: Any
) -> None:
    """The op as a kernel on the current stream of its device (``cuda:index``,
    as torch's device guard runs it), in CUDA's stream rules: what it read
    and wrote of its arguments, and the memory it made. Reading a value to
    the host (``item()``) makes the host wait for that stream. ``given``:
    the arguments' leaves, None when not yet listed."""
    found = device_api.emulation()
    order = None if found is None else found[0].order(found[1])
    if order is None:
        return
    touched = [
        (key, access == WRITE)
        for tensor, access in accesses(func, args, kwargs)
        if isinstance(tensor, EmulatedCudaTensor) and (key := storage_key(tensor))
    ]
    made = []
    outputs = (result,) if isinstance(result, torch.Tensor) else leaves(result)
    inputs: set[int] | None = None
    for out in outputs:
        if isinstance(out, EmulatedCudaTensor) and (key := storage_key(out)):
            if inputs is None:
                # A view (detach, a slice) shares its input's storage: not new memory.
                listed = leaves((args, kwargs)) if given is None else given
                inputs = {storage_key(leaf) for leaf in listed if isinstance(leaf, torch.Tensor)}
            if key not in inputs:
                made.append(key)
    if touched or made:
        stream = streams.current_on(found[0], found[1], index)  # type: ignore[index]  # found is set
        what = f"{func.overloadpacket} at {stacks.call_site(2, outside_dispatch=True)}"
        order.access(stream.clock, touched, what, streams.namer(order, stream), made=made)
        if func is _TO_HOST:
            order.synchronize_host([stream.clock])


_TO_HOST = torch.ops.aten._local_scalar_dense.default  # item(), float(t), bool(t): a blocking read


def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], index: int) -> Any:
    """An op on ``cuda:index``: a random one draws from that device's generator."""
    if kwargs.get("generator") is None and torch.Tag.nondeterministic_seeded in func.tags:
        return generators.drawing_on(index, lambda: _below_python(func, args, kwargs))
    return _below_python(func, args, kwargs)


def _below_python(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # An aten op reached by dispatch (torch's C++ code, DDP's reducer, a
    # decomposition) is not the program's call: the emulated tensors' device
    # checks are for what the program asks, so they are off for it (the
    # dispatch mode runs it with torch function handling off).
    try:
        return func(*args, **kwargs)
    except NotImplementedError:
        _refuse_cuda_only(func)
        raise


def _refuse_cuda_only(func: Any) -> None:
    """An op with a CUDA kernel and none for the CPU (a custom CUDA kernel, an
    extension's op) cannot run on an emulated device: said by name."""
    name = func.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(name, "CUDA") and not has(name, "CPU") and not has(name, "CompositeExplicitAutograd"):
        raise UnsupportedOperationError(
            f"{name}: a CUDA kernel with no CPU implementation cannot run on simdist's emulated CUDA "
            "devices (custom CUDA kernels and extensions need a GPU); run this test on a GPU "
            "(mark it gpu), see docs/cuda.md"
        )


@contextlib.contextmanager
def emulating() -> Iterator[None]:
    """Both modes, for one rank thread (or a helper thread of the rank).

    On the way out, a free that broke the caching allocator's stream rule
    and has not been raised at a later kernel is (ordering.RankOrder.freed)."""
    with EmulatedCudaMode(), EmulatedDeviceDispatch():
        yield
    order = streams.rank_order()
    if order is not None:
        order.raise_pending()
