"""Per-rank process state, swapped when the run token passes between ranks.

A process keeps some state once: torch's default generators, Python's and
numpy's global random state, module globals. Processes of a real world each
have their own; simdist's rank threads share one. Since only the rank holding
the run token executes, the process-wide values can belong to that rank: on
every switch the previous owner's values are saved and the incoming rank's
loaded, as an OS switches address spaces. Every rank starts from the values at
run start (deep copies), and the caller's values are put back when the run ends.

Runs in progress at the same time (from several threads) are kept apart by
one process-wide lock: a rank holds it while it holds its run's token and
executes, so one rank of all runs executes at a time. When a rank of another
run takes it, the previous run's values are saved (its rank's) and its
caller's values put back before the new run loads its own: each run sees
only its own ranks' state and its caller's.
"""

from __future__ import annotations

import copy
import ctypes
import importlib
import random
import struct
import threading
import types
from typing import Any, Callable, Sequence

import torch

try:
    import numpy as _np
except ImportError:  # numpy is optional for simdist
    _np = None


class _Slot:
    """One piece of process state: how to read it, write it and copy it.

    ``fingerprint`` (optional) is a cheap summary that changes whenever the
    state does; it lets a switch skip reading state a rank never touched, and
    writing a value the process already holds. It returns None when it cannot
    vouch for the current state (then the state is always read)."""

    __slots__ = ("name", "get", "set", "copy", "fingerprint")

    def __init__(self, name: str, get: Callable[[], Any], set_: Callable[[Any], None],
                 copy_: Callable[[Any], Any], fingerprint: Callable[[], Any] | None = None) -> None:
        self.name = name
        self.get = get
        self.set = set_
        self.copy = copy_
        self.fingerprint = fingerprint or (lambda: None)


def _same(value: Any) -> Any:
    return value  # immutable snapshots (generator states, tuples of ints)


def _copy_value(value: Any) -> Any:
    """A rank's own copy of a global's run-start value; an object deepcopy
    refuses (a lock, a C handle) stays shared, as nothing else can be done."""
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


_MT_BYTES = 4 + 624 * 4  # CPython's RandomObject: int index; uint32_t state[624]


def _python_random_fingerprint() -> Callable[[], Any] | None:
    """The Mersenne Twister words of ``random``'s global instance, read in
    place (reading them through getstate costs ~9 us a switch). Checked
    against getstate once, so another interpreter's layout disables it."""
    inst = random._inst  # type: ignore[attr-defined]
    address = id(inst) + object.__basicsize__
    try:
        raw = ctypes.string_at(address, _MT_BYTES)
        words = struct.unpack("624I", raw[4:])
        state = inst.getstate()[1]
        if words != state[:624] or struct.unpack("i", raw[:4])[0] != state[624]:
            return None
    except Exception:
        return None
    return lambda: (ctypes.string_at(address, _MT_BYTES), inst.gauss_next)


def _numpy_fingerprint() -> Callable[[], Any] | None:
    """numpy's legacy generator words (get/set_state cost ~35 us each). A
    cached Gaussian is spent without touching them, so the fingerprint only
    vouches for a state without one (see ``_NUMPY_GAUSS``)."""
    try:
        address = _np.random.mtrand._rand._bit_generator.ctypes.state_address
    except Exception:
        return None
    return lambda: ctypes.string_at(address, _MT_BYTES)


def _numpy_has_gauss(state: Any) -> bool:
    return bool(state[3])


def _builtin_slots() -> list[_Slot]:
    slots = [
        _Slot("torch default generator", torch.get_rng_state, torch.set_rng_state, _same),
        _Slot("random", random.getstate, random.setstate, _same, _python_random_fingerprint()),
    ]
    if _np is not None:
        slots.append(_Slot("numpy.random", _np.random.get_state, _np.random.set_state, _same,
                           _numpy_fingerprint()))
    # Only touch CUDA when the caller already has: initialising it here would
    # cost seconds and may fail on a machine without a driver.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        slots.append(_Slot("torch.cuda generators", torch.cuda.get_rng_state_all,
                           torch.cuda.set_rng_state_all, _same))
    return slots


def _module_slot(module: types.ModuleType) -> _Slot:
    namespace = module.__dict__

    def get() -> dict[str, Any]:
        return {k: v for k, v in namespace.items() if not (k.startswith("__") and k.endswith("__"))}

    def set_(values: dict[str, Any]) -> None:
        # Update in place (the module's dict is what its functions look up);
        # names a rank created are removed, names it deleted come back.
        for k in [k for k in namespace if k not in values
                  and not (k.startswith("__") and k.endswith("__"))]:
            del namespace[k]
        namespace.update(values)

    def copy_(values: dict[str, Any]) -> dict[str, Any]:
        return {k: v if isinstance(v, (types.ModuleType, types.FunctionType, type))
                else _copy_value(v) for k, v in values.items()}

    return _Slot(f"module {module.__name__}", get, set_, copy_)


def _attr_slot(obj: Any, attr: str) -> _Slot:
    missing = object()

    def set_(value: Any) -> None:
        if value is missing:
            if hasattr(obj, attr):
                delattr(obj, attr)
        else:
            setattr(obj, attr, value)

    return _Slot(f"{getattr(obj, '__name__', type(obj).__name__)}.{attr}",
                 lambda: getattr(obj, attr, missing), set_,
                 lambda v: v if v is missing else _copy_value(v))


def resolve_rank_local(entries: Sequence[Any]) -> list[_Slot]:
    """Turn ``rank_local=[...]`` entries into slots, refusing bad ones clearly."""
    if isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple)):
        raise TypeError(f"rank_local must be a list of module names, modules or (object, 'attr') "
                        f"pairs, got {type(entries).__name__}")
    slots = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            try:
                entry = importlib.import_module(entry)
            except ImportError as exc:
                raise ValueError(f"rank_local[{i}]: cannot import module {entry!r}: {exc}") from None
        if isinstance(entry, types.ModuleType):
            slots.append(_module_slot(entry))
        elif (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str)
              and entry[1]):
            slots.append(_attr_slot(*entry))
        else:
            raise TypeError(f"rank_local[{i}] must be a module name, a module or an "
                            f"(object, 'attribute') pair, got {entry!r}")
    return slots


# The process's state belongs to one run at a time: the run whose rank holds
# this lock (while it executes), or the last run that did (``_owner``).
_process_lock = threading.Lock()
_owner: "RankStates | None" = None
# Who holds the lock now: a ticket per acquisition, so a thread can only
# release its own hold (a run that ends releases a hold its stuck rank keeps).
_meta = threading.Lock()
_ticket: "tuple[RankStates, object] | None" = None
_holding = threading.local()  # .ticket: the hold this thread has, if any
_POLL_S = 0.05


def _take_process(states: "RankStates", aborted: Callable[[], Any]) -> bool:
    """Take the process-wide lock; give up (False) once ``aborted()`` says so."""
    global _ticket
    while not _process_lock.acquire(timeout=_POLL_S):
        if aborted() is not None:
            return False
    with _meta:
        _ticket = (states, object())
        _holding.ticket = _ticket
    return True


def release_process() -> None:
    """The calling thread gives up its hold of the process-wide lock, if it
    has one (its rank blocked in simdist, or left)."""
    global _ticket
    mine = getattr(_holding, "ticket", None)
    if mine is None:
        return
    _holding.ticket = None
    with _meta:
        if _ticket is mine:
            _ticket = None
            _process_lock.release()


def _release_for(states: "RankStates") -> None:
    """A run has ended: a hold its rank still has (stuck in C) is released."""
    global _ticket
    with _meta:
        if _ticket is not None and _ticket[0] is states:
            _ticket = None
            _process_lock.release()


def suspend_process() -> "tuple[RankStates, int] | None":
    """A rank that starts a run of its own (a nested run) lets that run's
    ranks take the process while it waits; ``resume_process`` takes it back."""
    mine = getattr(_holding, "ticket", None)
    if mine is None:
        return None
    states = mine[0]
    rank = states._loaded
    release_process()
    return None if rank is None else (states, rank)


def resume_process(held: "tuple[RankStates, int] | None") -> None:
    if held is not None:
        states, rank = held
        states.switch_to(rank)


class RankStates:
    """The process state of every rank of one run, and the caller's."""

    def __init__(self, world_size: int, rank_local: Sequence[Any] = ()) -> None:
        global _owner
        self._slots = _builtin_slots() + resolve_rank_local(rank_local)
        self._lock = threading.Lock()
        # The caller's values, not those of a rank of another run in progress.
        with _process_lock:
            if _owner is not None:
                _owner._evict()
                _owner = None
            self._caller = [s.get() for s in self._slots]
        # Generator snapshots are immutable, so every rank starts from the
        # caller's very objects: a rank that never draws is never written.
        self._ranks: list[list[Any] | None] = [None] * world_size
        self._loaded: int | None = None  # whose values the process holds now
        self._held = list(self._caller)  # the values the process holds now
        self._marks = [self._mark(i, v) for i, v in enumerate(self._caller)]
        self.switches = 0

    def _mark(self, i: int, value: Any) -> Any:
        slot = self._slots[i]
        if slot.name == "numpy.random" and _numpy_has_gauss(value):
            return None
        return slot.fingerprint()

    def switch_to(self, rank: int, aborted: Callable[[], Any] = lambda: None) -> None:
        """Make the process state ``rank``'s (called by ``rank`` on taking the
        token): take the process-wide lock, then swap."""
        global _owner
        mine = getattr(_holding, "ticket", None)
        if mine is None or mine is not _ticket:
            release_process()
            if not _take_process(self, aborted):
                return  # the run is being taken down; the rank only unwinds
        with self._lock:
            if _owner is not self:
                if _owner is not None:
                    _owner._evict()
                _owner = self
                # Whatever another run left, nothing of it is this run's.
                self._held = [s.get() for s in self._slots]
                self._marks = [None] * len(self._slots)
            if self._loaded == rank:
                return
            # Nobody ran since the owner gave up the token: the process still
            # holds the owner's values; read only what it changed.
            for i, slot in enumerate(self._slots):
                mark = self._marks[i]
                if mark is None or slot.fingerprint() != mark:
                    self._held[i] = slot.get()
            if self._loaded is not None:
                self._ranks[self._loaded] = list(self._held)
            values = self._ranks[rank]
            if values is None:
                values = [s.copy(v) for s, v in zip(self._slots, self._caller)]
            for i, (slot, value) in enumerate(zip(self._slots, values)):
                if value is not self._held[i]:
                    slot.set(value)
                    self._held[i] = value
                self._marks[i] = self._mark(i, value)
            self._loaded = rank
            self.switches += 1

    def _evict(self) -> None:
        """Another run takes the process: keep the loaded rank's values and
        put this run's caller's back (called with the process lock held)."""
        with self._lock:
            if self._loaded is not None:
                self._ranks[self._loaded] = [s.get() for s in self._slots]
            for slot, value in zip(self._slots, self._caller):
                slot.set(value)
            self._loaded = None

    def restore_caller(self) -> None:
        """Put the caller's values back (the run has ended)."""
        global _owner
        _release_for(self)
        with _process_lock:
            with self._lock:
                if _owner is self:
                    for slot, value in zip(self._slots, self._caller):
                        slot.set(value)
                    _owner = None
                self._loaded = None
