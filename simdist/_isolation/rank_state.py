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
import operator
import random
import struct
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

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

    __slots__ = ("close", "copy", "fingerprint", "get", "name", "set")

    def __init__(
        self,
        name: str,
        get: Callable[[], Any],
        set_: Callable[[Any], None],
        copy_: Callable[[Any], Any],
        fingerprint: Callable[[], Any] | None = None,
        close: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.get = get
        self.set = set_
        self.copy = copy_
        self.fingerprint = fingerprint or (lambda: None)
        self.close = close or (lambda: None)  # called once the caller's value is back


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
        slots.append(
            _Slot("numpy.random", _np.random.get_state, _np.random.set_state, _same, _numpy_fingerprint())
        )
    # Only touch CUDA when the caller already has: initialising it here would
    # cost seconds and may fail on a machine without a driver.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        slots.append(
            _Slot("torch.cuda generators", torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all, _same)
        )
    return slots


_CODE = (types.ModuleType, types.FunctionType, type)


def _module_slot(module: types.ModuleType) -> _Slot:
    """A module's globals. Names bound to code when the run starts (functions,
    classes, modules) and dunders are code, shared like code: rebinding one
    (monkeypatching) is not tracked. Every other name is state."""
    namespace = module.__dict__
    code = frozenset(
        k for k, v in namespace.items() if isinstance(v, _CODE) or (k.startswith("__") and k.endswith("__"))
    )
    lookup: list[Any] = [None, -1]  # itemgetter over the state names, namespace size it was built for

    def state_names() -> list[str]:
        return [k for k in namespace if k not in code]

    def get() -> dict[str, Any]:
        return {k: namespace[k] for k in state_names()}

    def set_(values: dict[str, Any]) -> None:
        # Update in place (the module's dict is what its functions look up);
        # names a rank created are removed, names it deleted come back.
        namespace.update(values)
        if len(namespace) != len(values) + len(code):  # (a deleted code name only costs a scan)
            for k in [k for k in state_names() if k not in values]:
                del namespace[k]

    def copy_(values: dict[str, Any]) -> dict[str, Any]:
        copied = {k: _copy_value(v) for k, v in values.items()}
        # All immutable (None, ints, strings): ranks can share one snapshot,
        # so a switch between ranks that never touched the module writes nothing.
        return values if all(copied[k] is v for k, v in values.items()) else copied

    def fingerprint() -> Any:
        # A snapshot holds references, so a global changed in place (a dict a
        # rank adds to) is already in it; only rebinding a name needs a new
        # read. The snapshot keeps the old objects alive, so their ids cannot
        # be reused by new ones. Only state names are looked at (~1 us for
        # Megatron's parallel_state, against ~20 us for the whole namespace).
        try:
            if lookup[1] != len(namespace):
                raise KeyError
            values = lookup[0](namespace)
        except KeyError:  # names added or removed: look again
            names = state_names()
            lookup[0] = (
                (lambda ns: ())
                if not names
                else ((lambda ns, k=names[0]: (ns[k],)) if len(names) == 1 else operator.itemgetter(*names))
            )
            lookup[1] = len(namespace)
            values = lookup[0](namespace)
        return tuple(map(id, values))

    return _Slot(module_slot_name(module.__name__), get, set_, copy_, fingerprint)


def module_slot_name(module_name: str) -> str:
    return f"module {module_name}"


def _attr_slot(obj: Any, attr: str) -> _Slot:
    missing = object()

    def set_(value: Any) -> None:
        if value is missing:
            if hasattr(obj, attr):
                delattr(obj, attr)
        else:
            setattr(obj, attr, value)

    # As for modules: the held value is a reference, so only rebinding the
    # attribute needs a new read (and the held object keeps its id unique).
    return _Slot(
        attr_slot_name(obj, attr),
        lambda: getattr(obj, attr, missing),
        set_,
        lambda v: v if v is missing else _copy_value(v),
        lambda: id(getattr(obj, attr, missing)),
    )


def attr_slot_name(obj: Any, attr: str) -> str:
    return f"{getattr(obj, '__name__', type(obj).__name__)}.{attr}"


def resolve_rank_local(entries: Sequence[Any]) -> list[_Slot]:
    """Turn ``rank_local=[...]`` entries into slots, refusing bad ones clearly."""
    if isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple)):
        raise TypeError(
            f"rank_local must be a list of module names, modules or (object, 'attr') "
            f"pairs, got {type(entries).__name__}"
        )
    slots = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            try:
                entry = importlib.import_module(entry)
            except ImportError as exc:
                raise ValueError(f"rank_local[{i}]: cannot import module {entry!r}: {exc}") from None
        if isinstance(entry, types.ModuleType):
            slots.append(_module_slot(entry))
        elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str) and entry[1]:
            slots.append(_attr_slot(*entry))
        else:
            raise TypeError(
                f"rank_local[{i}] must be a module name, a module or an "
                f"(object, 'attribute') pair, got {entry!r}"
            )
    return slots


# The process's state belongs to one run at a time: the run whose rank holds
# this lock (while it executes), or the last run that did (``_owner``).
_process_lock = threading.Lock()
_owner: RankStates | None = None
# Who holds the lock now: a ticket per acquisition, so a thread can only
# release its own hold (a run that ends releases a hold its stuck rank keeps).
_meta = threading.Lock()
_ticket: tuple[RankStates, object] | None = None
_holding = threading.local()  # .ticket: the hold this thread has, if any
_POLL_S = 0.05


def _take_process(states: RankStates, aborted: Callable[[], Any]) -> bool:
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


def _release_for(states: RankStates) -> None:
    """A run has ended: a hold its rank still has (stuck in C) is released."""
    global _ticket
    with _meta:
        if _ticket is not None and _ticket[0] is states:
            _ticket = None
            _process_lock.release()


def suspend_process() -> tuple[RankStates, int] | None:
    """A rank that starts a run of its own (a nested run) lets that run's
    ranks take the process while it waits; ``resume_process`` takes it back."""
    mine = getattr(_holding, "ticket", None)
    if mine is None:
        return None
    states = mine[0]
    rank = states._loaded
    release_process()
    return None if rank is None else (states, rank)


def resume_process(held: tuple[RankStates, int] | None) -> None:
    if held is not None:
        states, rank = held
        states.switch_to(rank)


class RankStates:
    """The process state of every rank of one run, and the caller's."""

    def __init__(self, world_size: int, rank_local: Sequence[Any] = ()) -> None:
        global _owner
        from .rank_local_defaults import default_slots  # it builds on this module's slots

        explicit = resolve_rank_local(rank_local)
        self._slots = _builtin_slots() + explicit + default_slots({s.name for s in explicit})
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
        # The fingerprint of the process state when each held value was read
        # or loaded (None: cannot vouch, read it at the next switch).
        self._marks = [self._mark(i, v, self._slots[i].fingerprint()) for i, v in enumerate(self._caller)]
        self.switches = 0

    def _mark(self, i: int, value: Any, fingerprint: Any) -> Any:
        if fingerprint is not None and self._slots[i].name == "numpy.random" and _numpy_has_gauss(value):
            return None
        return fingerprint

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
            held, marks = self._held, self._marks
            # Nobody ran since the owner gave up the token: the process still
            # holds the owner's values; read only what it changed (each
            # fingerprint is read once).
            for i, slot in enumerate(self._slots):
                mark = marks[i]
                fingerprint = slot.fingerprint()
                if mark is None or fingerprint != mark:
                    held[i] = value = slot.get()
                    marks[i] = self._mark(i, value, fingerprint)
            if self._loaded is not None:
                self._ranks[self._loaded] = list(held)
            values = self._ranks[rank]
            if values is None:
                values = [s.copy(v) for s, v in zip(self._slots, self._caller)]
            for i, (slot, value) in enumerate(zip(self._slots, values)):
                if value is not held[i]:
                    slot.set(value)
                    held[i] = value
                    # Read after writing: a module slot's fingerprint is the
                    # ids of the objects now bound, which a copy changes.
                    marks[i] = self._mark(i, value, slot.fingerprint())
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
                try:
                    if _owner is self:
                        for slot, value in zip(self._slots, self._caller):
                            slot.set(value)
                        _owner = None
                finally:
                    for slot in self._slots:
                        slot.close()
                    self._loaded = None
