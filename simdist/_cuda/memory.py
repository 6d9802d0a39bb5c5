"""Memory on emulated devices: each rank's allocations counted, frees checked (docs/cuda.md).

Each storage that becomes emulated is counted for the rank (and device) that
made it, in the caching allocator's 512-byte blocks, until the storage dies (a
weak reference tells) or is resized (FSDP2 frees its unsharded parameters so).
The same records check the caching allocator's rule about streams (freed
memory goes at once to the next allocation on the stream it was *made* on): a
free that breaks it is an ``AsyncRaceError`` at the rank's next kernel,
collective or the end of its body (a free happens in a weak reference's
callback, where nothing can be raised).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import device_api, streams

BLOCK = 512  # the caching allocator's smallest block and its rounding


def _rounded(nbytes: int) -> int:
    return -(-nbytes // BLOCK) * BLOCK


class _Counter:
    """One rank's bytes on one emulated device."""

    __slots__ = ("allocated", "allocations", "freed", "frees", "peak", "reserved", "reserved_peak", "total")

    def __init__(self) -> None:
        self.allocated = self.peak = self.reserved = self.reserved_peak = 0
        self.total = self.freed = self.allocations = self.frees = 0

    def add(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.total += nbytes
        self.allocations += 1
        if self.allocated > self.peak:
            self.peak = self.allocated
        if self.allocated > self.reserved:
            self.reserved = self.allocated
            if self.reserved > self.reserved_peak:
                self.reserved_peak = self.reserved

    def remove(self, nbytes: int) -> None:
        self.allocated -= nbytes
        self.freed += nbytes
        self.frees += 1


class _Record:
    """A live emulated storage: whose, how big, where made, streams it is kept for."""

    __slots__ = ("counter", "kept_for", "made_on", "nbytes", "order", "ptr", "ref")

    def __init__(self, counter: _Counter, nbytes: int, ptr: int, order: Any, made_on: Any) -> None:
        self.counter = counter
        self.nbytes = nbytes
        self.ptr = ptr
        self.order = order  # the making rank's stream rules (ordering.RankOrder), None when off
        self.made_on = made_on  # the allocating stream's clock
        self.kept_for: set[Any] = set()  # clocks of the streams named by record_stream
        self.ref: Any = None


class DeviceMemory:
    """One run's emulated allocations, per rank and device."""

    def __init__(self) -> None:
        self._counters: dict[tuple[int, int], _Counter] = {}
        self._live: dict[int, _Record] = {}  # id(storage) -> its record
        self._lock = threading.Lock()
        self._me = weakref.ref(self)  # what callbacks hold: no cycle through the records

    def counter(self, rank: int, index: int) -> _Counter:
        counter = self._counters.get((rank, index))
        if counter is None:
            counter = self._counters.setdefault((rank, index), _Counter())
        return counter

    def made(self, storage: torch.UntypedStorage, rank: int, index: int, order: Any, made_on: Any) -> None:
        """``storage`` is on ``cuda:index`` now, made by ``rank`` on the stream
        whose clock is ``made_on`` (its stream rules: ``order``)."""
        key = id(storage)
        if key in self._live:
            return
        nbytes = _rounded(storage.nbytes())
        record = _Record(self.counter(rank, index), nbytes, storage.data_ptr(), order, made_on)
        record.ref = weakref.ref(storage, functools.partial(_freed, self._me, key))
        with self._lock:
            self._live[key] = record
            record.counter.add(nbytes)

    def resized(self, storage: torch.UntypedStorage) -> None:
        record = self._live.get(id(storage))
        if record is not None:
            nbytes = _rounded(storage.nbytes())
            with self._lock:
                record.counter.remove(record.nbytes)
                record.counter.add(nbytes)
                record.nbytes = nbytes
            record.ptr = storage.data_ptr()

    def kept_for(self, storage: torch.UntypedStorage, stream: Any) -> None:
        """``record_stream``: the storage's memory waits for ``stream``'s work before reuse."""
        record = self._live.get(id(storage))
        if record is not None:
            record.kept_for.add(stream)

    def freed(self, key: int) -> None:
        with self._lock:
            record = self._live.pop(key, None)
            if record is None:
                return
            record.counter.remove(record.nbytes)
        if record.order is not None:
            record.order.freed(record.ptr, record.made_on, record.kept_for)

    def empty_cache(self, rank: int, index: int) -> None:
        counter = self.counter(rank, index)
        with self._lock:
            counter.reserved = counter.allocated

    def reset_peak(self, rank: int, index: int) -> None:
        counter = self.counter(rank, index)
        with self._lock:
            counter.peak = counter.allocated
            counter.reserved_peak = counter.reserved


def _freed(memory: weakref.ref[DeviceMemory], key: int, _ref: object) -> None:
    """A storage's weak-reference callback: holds the run's memory weakly."""
    found = memory()
    if found is not None:
        found.freed(key)


def stats(counter: _Counter) -> dict[str, Any]:
    """``torch.cuda.memory_stats``'s keys that an emulated device can answer."""
    # One pool: the caching allocator's small and large pools are not modelled
    # (their keys are absent rather than a guess).
    return {
        "active_bytes.all.current": counter.allocated,
        "active_bytes.all.peak": counter.peak,
        "allocated_bytes.all.allocated": counter.total,
        "allocated_bytes.all.current": counter.allocated,
        "allocated_bytes.all.freed": counter.freed,
        "allocated_bytes.all.peak": counter.peak,
        "allocation.all.allocated": counter.allocations,
        "allocation.all.current": counter.allocations - counter.frees,
        "allocation.all.freed": counter.frees,
        "num_alloc_retries": 0,
        "num_ooms": 0,
        "reserved_bytes.all.current": counter.reserved,
        "reserved_bytes.all.peak": counter.reserved_peak,
    }


# ------------------------------------------------------------ in the ranks


_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction


def tensor_made(tensor: torch.Tensor, index: int) -> None:
    """A tensor became emulated on ``cuda:index``: its storage counted once."""
    found = device_api.emulation()
    if found is None:
        return
    emulated, rank = found
    if index >= emulated.device_count:
        raise RuntimeError(
            f"CUDA error: invalid device ordinal (a tensor on cuda:{index}; the emulated node has "
            f"{emulated.device_count} device(s), simdist.run(cuda_devices=...))"
        )
    memory: DeviceMemory = emulated.memory
    with _NO_TORCH_FUNCTION():  # a method call on an emulated tensor would go through its handlers
        storage = tensor.untyped_storage()
    if id(storage) in memory._live:
        return  # a view, or a tensor moved in place: counted when its storage was made
    order = emulated.order(rank)
    clock = None
    if order is not None:
        stream = streams.current_on(emulated, rank, index)
        clock = stream.clock
        streams.namer(order, stream)  # messages name the stream as the program knows it
    memory.made(storage, rank, index, order, clock)


def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    found = device_api.emulation()
    if found is not None and isinstance(stream, streams.EmulatedStream):
        with _NO_TORCH_FUNCTION():
            storage = tensor.untyped_storage()
        found[0].memory.kept_for(storage, stream.clock)


def resized(storage: torch.UntypedStorage) -> None:
    """``storage`` was resized in place (its old memory freed, new memory given)."""
    found = device_api.emulation()
    if found is not None:
        found[0].memory.resized(storage)


def _counter(device: Any) -> _Counter:
    emulated, rank = device_api.emulating_rank()
    return emulated.memory.counter(rank, device_api.device_index(device))


def _reading(field: str) -> Callable[..., int]:
    def read(device: Any = None) -> int:
        return int(getattr(_counter(device), field))

    return read


def memory_stats(device: Any = None) -> dict[str, Any]:
    return stats(_counter(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    emulated, rank = device_api.emulating_rank()
    emulated.memory.reset_peak(rank, device_api.device_index(device))


def empty_cache() -> None:
    emulated, rank = device_api.emulating_rank()
    for device in range(emulated.device_count):
        emulated.memory.empty_cache(rank, device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) of the emulated device: its total less what this rank reserved."""
    total = device_api.PROPERTIES.total_memory
    return (total - _counter(device).reserved, total)


REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "memory_allocated": _reading("allocated"),
    "max_memory_allocated": _reading("peak"),
    "memory_reserved": _reading("reserved"),
    "max_memory_reserved": _reading("reserved_peak"),
    "memory_stats": memory_stats,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "empty_cache": empty_cache,
    "mem_get_info": mem_get_info,
}
