"""Memory on emulated devices: each rank's allocations counted, frees checked.

A GPU process's ``torch.cuda.memory_allocated()`` counts the bytes of the
caching allocator's blocks its live tensors hold, on each device;
``max_memory_allocated`` the highest that count reached since the last
``reset_peak_memory_stats``. Here each storage that becomes emulated is
counted for the rank (and device) that made it, in blocks of 512 bytes as
the caching allocator rounds, until the storage dies (a weak reference
tells) or is resized (FSDP2 frees its unsharded parameters so). The
reserved memory is modelled as a caching allocator that keeps every block
it was given until ``empty_cache``: the highest allocated count since then.

The same records check the caching allocator's one rule about streams:
memory freed is handed out again at once to the next allocation on the
stream it was *made* on, so a tensor used on another stream must be kept
alive for that stream (``tensor.record_stream(side)``) or that stream's use
must be ordered before the free (``wait_stream``, an event, a synchronize).
A free that breaks it is an ``AsyncRaceError`` at the rank's next kernel,
collective or the end of its body (a free happens in a weak reference's
callback, where nothing can be raised).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from . import device_api, streams
from . import tensor as tensor_module

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
        record.ref = weakref.ref(storage, _Freed(self._me, key))
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


class _Freed:
    """A storage's weak-reference callback: holds the run's memory weakly."""

    __slots__ = ("key", "memory")

    def __init__(self, memory: weakref.ref[DeviceMemory], key: int) -> None:
        self.memory = memory
        self.key = key

    def __call__(self, _ref: object) -> None:
        memory = self.memory()
        if memory is not None:
            memory.freed(self.key)


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


def _made(tensor: torch.Tensor, index: int) -> None:
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


def _record_stream(tensor: torch.Tensor, stream: Any) -> None:
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


tensor_module.HOOKS["made"] = _made
tensor_module.HOOKS["record_stream"] = _record_stream


def _mine(device: Any) -> tuple[DeviceMemory, int, int]:
    found = device_api.emulation()
    assert found is not None  # only called from the emulating replacements
    emulated, rank = found
    return emulated.memory, rank, device_api.device_index(device)


def _counter(device: Any) -> _Counter:
    memory, rank, index = _mine(device)
    return memory.counter(rank, index)


def memory_allocated(device: Any = None) -> int:
    return _counter(device).allocated


def max_memory_allocated(device: Any = None) -> int:
    return _counter(device).peak


def memory_reserved(device: Any = None) -> int:
    return _counter(device).reserved


def max_memory_reserved(device: Any = None) -> int:
    return _counter(device).reserved_peak


def memory_stats(device: Any = None) -> dict[str, Any]:
    return stats(_counter(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    memory, rank, index = _mine(device)
    memory.reset_peak(rank, index)


def empty_cache() -> None:
    found = device_api.emulation()
    assert found is not None  # only called from the emulating replacements
    emulated, rank = found
    for device in range(emulated.device_count):
        emulated.memory.empty_cache(rank, device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) of the emulated device: its total less what this rank reserved."""
    total = device_api.PROPERTIES.total_memory
    return (total - _counter(device).reserved, total)


REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "memory_stats": memory_stats,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "empty_cache": empty_cache,
    "mem_get_info": mem_get_info,
}
