"""State slots: one piece of process state each, read, written and copied per rank.

A slot is what ``RankStates`` swaps at a run-token switch: a generator, a
module's globals, an object's attribute. This module knows nothing of runs or
locks; ``rank_state`` builds on it, and so do the rank-local defaults (which
is why the slots live here: the two used to import each other).
"""

from __future__ import annotations

import copy
import importlib
import operator
import types
from collections.abc import Callable, Sequence
from typing import Any


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
    """A rank's own copy of a default slot's run-start value (state simdist
    swaps without being asked, see ``rank_local_defaults``); an object deepcopy
    refuses stays shared there. ``rank_local`` entries never get here: they
    are checked up front (``resolve_rank_local``) and copied strictly."""
    try:
        return copy.deepcopy(value)
    except Exception:
        return value


Copier = Callable[[Any], Any]


_CODE = (types.ModuleType, types.FunctionType, type)


def _module_slot(module: types.ModuleType, copier: Copier = _copy_value) -> _Slot:
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
        copied = {k: copier(v) for k, v in values.items()}
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


def _attr_slot(obj: Any, attr: str, copier: Copier = _copy_value) -> _Slot:
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
        lambda v: v if v is missing else copier(v),
        lambda: id(getattr(obj, attr, missing)),
    )


def attr_slot_name(obj: Any, attr: str) -> str:
    return f"{getattr(obj, '__name__', type(obj).__name__)}.{attr}"


def resolve_rank_local(entries: Sequence[Any]) -> list[_Slot]:
    """Turn ``rank_local=[...]`` entries into slots, refusing bad ones clearly.

    Every entry is checked before any rank starts: it must be swappable (an
    attribute that can be set) and its run-start values must be copyable for
    each rank, by ``copy.deepcopy`` or by the copy function given with the
    entry (``(module, copy_fn)``, ``(obj, "attr", copy_fn)``; ``copy_fn(value)``
    returns a rank's own value). Nothing is ever shared silently."""
    if isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple)):
        raise TypeError(
            f"rank_local must be a list of module names, modules or (object, 'attr') "
            f"pairs, got {type(entries).__name__}"
        )
    slots = []
    for i, entry in enumerate(entries):
        copier: Copier | None = None
        if (
            isinstance(entry, tuple)
            and len(entry) in (2, 3)
            and callable(entry[-1])
            and not isinstance(entry[-1], str)
        ):
            if len(entry) == 2 and not isinstance(entry[0], (str, types.ModuleType)):
                raise TypeError(
                    f"rank_local[{i}]: a copy function goes with a module, a module name or an "
                    f"(object, 'attribute') pair, as (module, copy_fn) or (object, 'attribute', "
                    f"copy_fn); got {entry!r}"
                )
            *target, copier = entry
            entry = target[0] if len(target) == 1 else tuple(target)
        if isinstance(entry, str):
            try:
                entry = importlib.import_module(entry)
            except ImportError as exc:
                raise ValueError(f"rank_local[{i}]: cannot import module {entry!r}: {exc}") from None
        if isinstance(entry, types.ModuleType):
            slot = _module_slot(entry, copier or copy.deepcopy)
            values = slot.get()
            what = {k: f"module {entry.__name__}'s global {k!r}" for k in values}
        elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str) and entry[1]:
            _check_settable(i, *entry)
            slot = _attr_slot(*entry, copier or copy.deepcopy)
            values = {entry[1]: slot.get()}
            what = {entry[1]: slot.name}
        else:
            raise TypeError(
                f"rank_local[{i}] must be a module name, a module or an "
                f"(object, 'attribute') pair, got {entry!r}"
            )
        if copier is None:
            _check_copyable(i, values, what)
        slots.append(slot)
    return slots


def _check_settable(i: int, obj: Any, attr: str) -> None:
    """An attribute simdist cannot set (a read-only property, a frozen or
    slotted object) cannot be swapped per rank: refused before any rank starts
    (it used to fail at the first switch, and again at every later run)."""
    missing = object()
    name = attr_slot_name(obj, attr)
    try:
        value = getattr(obj, attr, missing)
        if value is missing:
            setattr(obj, attr, None)  # a rank may create it: it must be able to
            delattr(obj, attr)
        else:
            setattr(obj, attr, value)  # the value it already has: changes nothing
    except Exception as exc:
        raise ValueError(
            f"rank_local[{i}]: {name} cannot be swapped per rank: setting it raised "
            f"{type(exc).__name__}: {exc}. List the attribute (or module global) that holds "
            f"the state instead"
        ) from None


def _check_copyable(i: int, values: dict[str, Any], what: dict[str, str]) -> None:
    for key, value in values.items():
        try:
            copy.deepcopy(value)
        except Exception as exc:
            raise TypeError(
                f"rank_local[{i}]: {what[key]} ({type(value).__name__}) cannot be deep-copied for "
                f"each rank ({type(exc).__name__}: {exc}). Pass a copy function with the entry, "
                f"(module, copy_fn) or (object, 'attribute', copy_fn), that returns a rank's own "
                f"value (a new lock, a reopened file), or give the type a __deepcopy__; simdist "
                f"never shares a rank_local value between ranks"
            ) from None
