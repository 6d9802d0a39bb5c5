"""``torch.cuda``'s device API, answered per rank while a run emulates CUDA (docs/cuda.md).

Each rank has its own current device (``rank % device_count``, as torchrun's
``LOCAL_RANK``, until it calls ``set_device``). These functions answer in an
emulating rank only: ``patch`` installs them and defers every other caller to
torch's own. ``synchronize`` has no queue to drain (it orders the host after
every stream in the stream rules).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.cuda

from .._core import identity
from .ordering import RankOrder


@dataclass(frozen=True)
class EmulatedDeviceProperties:
    """What ``torch.cuda.get_device_properties`` reports for an emulated device."""

    name: str = "simdist emulated CUDA device (CPU storage)"
    major: int = 9
    minor: int = 0
    total_memory: int = 80 * 2**30
    multi_processor_count: int = 132
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


PROPERTIES = EmulatedDeviceProperties()


class EmulatedCuda:
    """One run's emulated node: its device count and each rank's current device."""

    def __init__(self, world_size: int, device_count: int, check_streams: bool = True) -> None:
        self.device_count = device_count
        # CUDA's stream rules, checked with the collective sanitizer (ordering.py).
        self._orders = [RankOrder(rank) for rank in range(world_size)] if check_streams else None
        self._current = [rank % device_count for rank in range(world_size)]
        self._streams: dict[int, dict[int, Any]] = {}
        self.generators: dict[tuple[int, int], Any] = {}  # (rank, index) -> its generator (generators.py)
        self._defaults: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()
        self.memory: Any = None  # the run's memory.DeviceMemory (memory.py builds on this module)

    def current(self, rank: int) -> int:
        return self._current[rank]

    def set_current(self, rank: int, index: int) -> None:
        with self._lock:
            self._current[rank] = index

    def order(self, rank: int) -> RankOrder | None:
        return None if self._orders is None else self._orders[rank]

    def rank_streams(self, rank: int) -> dict[int, Any]:
        """The rank's current stream per device index (``streams``)."""
        return self._streams.setdefault(rank, {})

    def default_stream(self, rank: int, index: int, make: Any) -> Any:
        key = (rank, index)
        stream = self._defaults.get(key)
        if stream is None:
            stream = self._defaults[key] = make(index)
        return stream


def emulation() -> tuple[EmulatedCuda, int] | None:
    """The calling thread's run emulation and rank, None outside one."""
    world = identity.me.world
    emulated = getattr(world, "cuda_emulation", None) if world is not None else None
    if emulated is None:
        return None
    return emulated, identity.me.rank


def current_index() -> int:
    """The calling rank's current device (``torch.cuda.current_device()``), 0 outside emulating ranks."""
    found = emulation()
    return 0 if found is None else found[0].current(found[1])


def emulating_rank() -> tuple[EmulatedCuda, int]:
    """The calling thread's run emulation and rank; raises outside one."""
    found = emulation()
    if found is None:
        raise RuntimeError("simdist: an emulated CUDA call outside a rank of a run with cuda='emulate'")
    return found


def device_index(device: Any) -> int:
    """The emulated device index ``device`` names (None, -1: the current one)."""
    found = emulating_rank()
    if device is None or (isinstance(device, int) and not isinstance(device, bool) and device < 0):
        return current_index()
    return _checked_index(device, found[0], "device")


def _checked_index(device: Any, emulated: EmulatedCuda, what: str) -> int:
    if isinstance(device, torch.device) or isinstance(device, str):
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {dev}")
        index = dev.index if dev.index is not None else -1
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise TypeError(f"{what}: expected a device index or a cuda device, got {device!r}")
    if index < 0:
        index = current_index()
    if index >= emulated.device_count:
        raise RuntimeError(
            f"CUDA error: invalid device ordinal ({what}({device!r}); the emulated node has "
            f"{emulated.device_count} device(s), simdist.run(cuda_devices=...))"
        )
    return index


# The replacements below answer in an emulating rank only: patch.py defers
# every other caller to torch's own function.


def device_count() -> int:
    return emulating_rank()[0].device_count


def set_device(device: Any) -> None:
    emulated, rank = emulating_rank()
    if isinstance(device, int) and device < 0:
        return  # torch ignores a negative index
    emulated.set_current(rank, _checked_index(device, emulated, "set_device"))


def get_device_name(device: Any = None) -> str:
    if device is not None:
        _checked_index(device, emulating_rank()[0], "get_device_name")
    return PROPERTIES.name


def get_device_properties(device: Any = None) -> EmulatedDeviceProperties:
    if device is not None:
        _checked_index(device, emulating_rank()[0], "get_device_properties")
    return PROPERTIES


def get_device_capability(device: Any = None) -> tuple[int, int]:
    return (PROPERTIES.major, PROPERTIES.minor)


def synchronize(device: Any = None) -> None:
    emulated, rank = emulating_rank()
    order = emulated.order(rank)
    if order is not None:
        order.synchronize_host()


class device:
    """``torch.cuda.device(i)``: the rank's current device is ``i`` inside the block."""

    def __init__(self, device: Any) -> None:
        self._device = device
        self._previous: int | None = None
        self._theirs: Any = None

    def __enter__(self) -> None:
        found = emulation()
        if found is None:
            self._theirs = original(torch.cuda, "device")(self._device)
            self._theirs.__enter__()
            return
        emulated, rank = found
        self._previous = emulated.current(rank)
        if self._device is None or (isinstance(self._device, int) and self._device < 0):
            return
        emulated.set_current(rank, _checked_index(self._device, emulated, "device"))

    def __exit__(self, *exc: object) -> None:
        if self._theirs is not None:
            self._theirs.__exit__(*exc)
            return
        found = emulation()
        if found is not None and self._previous is not None:
            found[0].set_current(found[1], self._previous)


# What the patch replaced, by place, while it is installed (patch.py).
ORIGINAL: dict[tuple[object, str], Any] = {}


def original(owner: object, name: str) -> Any:
    """What ``owner.name`` is without the patch."""
    return ORIGINAL.get((owner, name)) or getattr(owner, name)
