"""CUDA streams and events of an emulated device (docs/cuda.md).

A rank's work runs in program order on the CPU, so every stream is already
synchronised with every other: an emulated stream or event records what the
program asked (which stream is current, what waited on what, for the stream
rules of ``ordering``) and never blocks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch

from . import device_api
from .ordering import Clock, RankOrder

_ids = itertools.count(1)


class EmulatedStream(torch.Stream):
    """``torch.cuda.Stream`` on an emulated device.

    A ``torch.Stream`` underneath (a CPU one), because torch's argument
    parser accepts nothing else where a stream goes (``Tensor.record_stream``);
    what it reports is the emulated device's."""

    def __new__(cls, device: Any = None, priority: int = 0, **_: Any) -> EmulatedStream:
        return super().__new__(cls, device=torch.device("cpu"))

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        index = device_api.device_index(device)
        self._index = index
        self._priority = priority
        self._id = next(_ids)
        self.clock = Clock(self._id)  # the ordering rules' view of it (ordering.py)

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", self._index)

    @property
    def device_index(self) -> int:  # type: ignore[override]
        return self._index

    @property
    def device_type(self) -> int:  # type: ignore[override]
        return 1  # c10::DeviceType::CUDA, as torch.cuda.Stream reports it

    @property
    def stream_id(self) -> int:  # type: ignore[override]
        return self._id

    @property
    def priority(self) -> int:
        return self._priority

    def wait_event(self, event: Any) -> None:
        if event.recorded is not None:
            seen, up_to = event.recorded
            self.clock.learn(seen, up_to)

    def wait_stream(self, stream: Any) -> None:
        self.clock.learn(stream.clock, (stream.clock.id, stream.clock.seq))

    def record_event(self, event: Any = None) -> Any:
        event = EmulatedEvent() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        order = rank_order()
        if order is not None:
            order.synchronize_host([self.clock])

    def __enter__(self) -> EmulatedStream:
        self._previous = current_stream(self._index)
        set_stream(self)
        return self

    def __exit__(self, *exc: object) -> None:
        set_stream(self._previous)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmulatedStream) and other._id == self._id

    def __hash__(self) -> int:
        return hash(("simdist emulated stream", self._id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self._index} cuda_stream={self._id:#x} (emulated)>"


class EmulatedEvent:
    """``torch.cuda.Event`` on an emulated device."""

    def __init__(
        self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> None:
        self.enable_timing = enable_timing
        # What a stream that waits for the event learns: the recording
        # stream's view at the record, and that stream up to its last kernel.
        self.recorded: tuple[dict[int, int], tuple[int, int]] | None = None
        self._time: float | None = None

    def record(self, stream: EmulatedStream | None = None) -> None:
        clock = (current_stream() if stream is None else stream).clock
        self.recorded = (dict(clock.seen), (clock.id, clock.seq))
        self._time = time.perf_counter()

    def wait(self, stream: EmulatedStream | None = None) -> None:
        (current_stream() if stream is None else stream).wait_event(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        order = rank_order()
        if order is not None and self.recorded is not None:
            order.host.learn(*self.recorded)

    def elapsed_time(self, end_event: EmulatedEvent) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


def rank_order() -> RankOrder | None:
    """The calling rank's stream ordering record, None where nothing is checked."""
    found = device_api.emulation()
    return None if found is None else found[0].order(found[1])


def default_stream(device: Any = None) -> EmulatedStream:
    emulated, rank = device_api.emulating_rank()
    return emulated.default_stream(rank, device_api.device_index(device), EmulatedStream)


def current_stream(device: Any = None) -> EmulatedStream:
    emulated, rank = device_api.emulating_rank()
    return current_on(emulated, rank, device_api.device_index(device))


def current_on(emulated: Any, rank: int, index: int) -> EmulatedStream:
    """``rank``'s current stream on ``cuda:index`` (the caller knows its run)."""
    return emulated.rank_streams(rank).get(index) or emulated.default_stream(rank, index, EmulatedStream)


def set_stream(stream: EmulatedStream) -> None:
    emulated, rank = device_api.emulating_rank()
    emulated.rank_streams(rank)[stream._index] = stream


def namer(order: RankOrder, stream: EmulatedStream) -> Callable[[int], str]:
    """Names for the streams of ``order``'s messages (``stream``: the one in use now)."""
    if stream._id not in order.labels:
        kind = "the default stream" if stream is default_stream(stream._index) else f"stream {stream._id:#x}"
        order.labels[stream._id] = f"{kind} of cuda:{stream._index}"
    return lambda ident: order.labels.get(ident, "a communicator stream")


def host_waits(index: int) -> None:
    order = rank_order()
    if order is not None:
        order.synchronize_host([current_stream(index).clock])
