"""Process-wide state of torch and Megatron-core that is rank-local without asking.

On a cluster every rank has its own copy of what third-party code keeps once
per process; simdist swaps such state at every token switch (``rank_state``),
like ``rank_local=`` entries, without the user having to know it exists.
Only state that makes real, unmodified code fail or give wrong results when
shared is listed here:

* DTensor's custom op handlers (``DTensor._op_dispatcher._custom_op_handlers``):
  ``loss_parallel()`` adds the loss ops on entry and pops them on exit; shared,
  the first rank to leave removes them from under its peers and the second
  one's exit fails with ``KeyError: aten._log_softmax.default``. Each rank
  gets its own contents; the dict object stays the same (torch's C++
  dispatch reads it).
* DTensor's random-op tracker (``torch.distributed.tensor._random._rng_tracker``):
  made by a process's first random op on a DTensor, it holds that process's
  generator offsets.
* torch.distributed's caches whose keys are equal across ranks while their
  values are rank-specific: each rank starts with empty ones (``torch_caches``).
* ``torch.nn``'s global module hooks (``torch.nn.modules.module._global_*``):
  module-tracking tools (``ModTracker``, which ``CommDebugMode`` uses) register
  them per process; shared, a rank's hooks see its peers' modules enter and
  leave ("The Module hierarchy tracking is wrong"). Each rank starts from the
  run-start hooks (its own dicts, the same hook functions).
* c10d's backend registry (``Backend.register_backend``'s tables): a peer
  asking ``is_backend_available`` before registering a backend gets False.
* Megatron-core's process groups, ranks and buffers
  (``megatron.core.parallel_state``'s globals: ``initialize_model_parallel``
  on a second rank fails with "... is already initialized") and its
  model-parallel RNG tracker (``megatron.core.tensor_parallel.random``).

These modules are rank-local also when a rank imports them first, during the
run (importing Megatron costs seconds, so a run never imports it itself): an
import hook, in place only while such a run lasts, keeps the module's state
as it is right after its code ran; every other rank starts from that, as a
process importing it would, and the caller gets it back when the run ends.
DTensor's state is watched that way only if ``torch.distributed.tensor`` was
not imported before the run.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

from . import patches, torch_caches
from .import_chain import WrappingFinder, WrappingLoader
from .slots import _attr_slot, _module_slot, _Slot, attr_slot_name, module_slot_name

# Megatron-core modules whose globals are process state (see the module doc).
MEGATRON_MODULES = ("megatron.core.parallel_state", "megatron.core.tensor_parallel.random")
_DTENSOR = "torch.distributed.tensor"


def _dtensor_handlers_slot(dispatcher: Any) -> _Slot:
    """The custom-handler dict's contents, per rank, restored in place."""
    attr = "_custom_op_handlers"

    def get() -> tuple[dict, dict]:
        table = getattr(dispatcher, attr)
        return table, dict(table)

    def set_(value: tuple[dict, dict]) -> None:
        table, contents = value
        # Context parallelism rebinds the attribute for a while; put back the
        # dict this rank had, then its contents.
        if getattr(dispatcher, attr) is not table:
            setattr(dispatcher, attr, table)
        if table != contents:
            table.clear()
            table.update(contents)

    def copy_(value: tuple[dict, dict]) -> tuple[dict, dict]:
        return value  # a snapshot nobody mutates (handlers are functions: shared, like code)

    def fingerprint() -> Any:
        # Keys and handlers compare by identity, so this costs about a microsecond.
        table = getattr(dispatcher, attr)
        return table, tuple(table.items())

    return _Slot(attr_slot_name(type(dispatcher), attr), get, set_, copy_, fingerprint)


def _dtensor_api_slot(module: types.ModuleType) -> _Slot | None:
    dispatcher = getattr(getattr(module, "DTensor", None), "_op_dispatcher", None)
    if not isinstance(getattr(dispatcher, "_custom_op_handlers", None), dict):
        return None
    return _dtensor_handlers_slot(dispatcher)


def _dtensor_tracker_slot(module: types.ModuleType) -> _Slot | None:
    return _attr_slot(module, "_rng_tracker") if hasattr(module, "_rng_tracker") else None


# DTensor's modules whose state is rank-local by default: the slot that swaps
# it once the module exists, and that slot's name.
_DTENSOR_WATCHED: dict[str, tuple[Callable[[types.ModuleType], _Slot | None], str]] = {
    f"{_DTENSOR}._api": (_dtensor_api_slot, "OpDispatcher._custom_op_handlers"),
    f"{_DTENSOR}._random": (_dtensor_tracker_slot, f"{_DTENSOR}._random._rng_tracker"),
}


def _watched(name: str) -> tuple[Callable[[types.ModuleType], _Slot | None], str] | None:
    """A watched module's slot maker and slot name (``MEGATRON_MODULES`` read now: tests swap it)."""
    if name in _DTENSOR_WATCHED:
        return _DTENSOR_WATCHED[name]
    if name in torch_caches.MODULES:
        return torch_caches.module_slot, torch_caches.slot_name(name)
    return (_module_slot, module_slot_name(name)) if name in MEGATRON_MODULES else None


_fresh: dict[str, Any] = {}  # a watched module's state right after its code ran


class _Recording(WrappingLoader):
    def run(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        watched = _watched(module.__name__)
        slot = None if watched is None else watched[0](module)
        if slot is not None:
            # A copy: the importing rank goes on to change the live objects in place.
            _fresh[module.__name__] = slot.copy(slot.get())


class _FreshGlobals(WrappingFinder):
    """Records a watched module's state right after its code has run."""

    wrapper = _Recording

    def wants(self, fullname: str) -> bool:
        return _watched(fullname) is not None


_fresh_globals = _FreshGlobals()
_installed: dict[str, bool] = {}  # top-level package -> importable (looked up once)


def install_import_hook() -> None:
    sys.meta_path.insert(0, _fresh_globals)


def remove_import_hook() -> None:
    if _fresh_globals in sys.meta_path:
        sys.meta_path.remove(_fresh_globals)


patches.register("import hook", install_import_hook, remove_import_hook, [(sys, "meta_path")])


_NOT_YET = object()  # a rank's value for a module that did not exist at run start


def _late_slot(names: list[str], release: Any) -> _Slot:
    """The modules a rank may import during the run, as one slot. Until one
    exists there is nothing to swap, and one look at ``sys.modules`` vouches
    for them all at a switch; afterwards each rank whose value for it is still
    ``_NOT_YET`` gets a copy of its fresh state, as its own first import would
    have given it, and it is always read (no fingerprint): only in runs that
    imported it. A value stays ``_NOT_YET`` until its module exists, and a
    rank's copy is the value itself, so ranks share one tuple until then."""
    found: dict[str, _Slot] = {}  # a module's slot, once a rank imported it

    def slot_of(name: str) -> _Slot | None:
        if name not in found:
            module = sys.modules.get(name)
            watched = _watched(name)
            if module is None or name not in _fresh or watched is None:
                return None
            slot = watched[0](module)
            if slot is None:
                return None
            found[name] = slot
        return found[name]

    def get() -> tuple[Any, ...]:
        slots = [slot_of(name) for name in names]
        return tuple(_NOT_YET if slot is None else slot.get() for slot in slots)

    def set_(values: tuple[Any, ...]) -> None:
        for name, value in zip(names, values):
            slot = slot_of(name)
            if slot is not None:
                slot.set(slot.copy(_fresh[name]) if value is _NOT_YET else value)

    def fingerprint() -> Any:
        # Importing a module puts it in sys.modules; a module found once must
        # be read even if it left sys.modules since. The keys view's
        # isdisjoint walks the smaller side (the few names); a set's walks the
        # dict it is given (every module: ~30 us a switch).
        return _NOT_YET if not found and sys.modules.keys().isdisjoint(names) else None

    label = ", ".join(_watched(name)[1] for name in names)  # type: ignore[index]  # watched names only
    return _Slot(f"modules a rank may import: {label}", get, set_, lambda v: v, fingerprint, close=release)


def _importable(name: str) -> bool:
    top = name.partition(".")[0]
    if top not in _installed:
        try:  # a top-level lookup imports nothing
            _installed[top] = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            _installed[top] = False
    return _installed[top]


_NN_MODULE = "torch.nn.modules.module"
_HOOK_GLOBALS = (
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_buffer_registration_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
    "_global_forward_pre_hooks",
    "_global_is_full_backward_hook",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
)


def _tables_slot(label: str, owner: Any, names: tuple[str, ...]) -> _Slot:
    """Tables ``owner`` keeps under ``names`` as one slot (one read a switch,
    not one a table), each rank its own copies of the dicts and lists (the
    hook functions in them are shared, like code); read where their users
    look them up at call time, by name."""
    lookup = vars(owner).__getitem__  # a module's dict, a class's mappingproxy

    def get() -> tuple[Any, ...]:
        return tuple(map(lookup, names))

    def set_(value: tuple[Any, ...]) -> None:
        for name, table in zip(names, value, strict=True):
            setattr(owner, name, table)

    def copy_(value: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(v.copy() if isinstance(v, dict | list) else v for v in value)

    # Read at every switch: builtins only (a generator costs a call per item).
    return _Slot(label, get, set_, copy_, lambda: tuple(map(id, map(lookup, names))))


def _module_hooks_slot() -> _Slot | None:
    """torch.nn's global module hooks (Module._call_impl looks each dict up by its global name)."""
    module = sys.modules.get(_NN_MODULE)
    names = tuple(n for n in _HOOK_GLOBALS if module is not None and hasattr(module, n))
    return _tables_slot(f"module {_NN_MODULE}'s global hooks", module, names) if names else None


_BACKEND_TABLES = (
    "backend_list",
    "_plugins",
    "default_device_backend_map",
    "backend_capability",
    "backend_type_map",
)


def _backend_registry_slot() -> _Slot | None:
    """c10d's backend registry tables."""
    kind = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "Backend", None)
    if kind is None:
        return None
    names = tuple(n for n in _BACKEND_TABLES if isinstance(getattr(kind, n, None), list | dict))
    return _tables_slot("c10d's backend registry", kind, names)


def default_slots(taken: set[str]) -> list[_Slot]:
    """Slots for the default rank-local state the process holds now, leaving
    out any the caller already listed in ``rank_local`` (names in ``taken``)."""
    slots: list[_Slot] = []
    late: list[str] = []
    for name in _DTENSOR_WATCHED:
        # A rank may import DTensor first (a test module that imports lazily):
        # its tables must still be each rank's own.
        _add(slots, late, name, _DTENSOR not in sys.modules)
    for extra in (_module_hooks_slot(), _backend_registry_slot()):
        if extra is not None:
            slots.append(extra)
    for name in (*torch_caches.MODULES, *MEGATRON_MODULES):
        # (A module the caller lists in rank_local is swapped whole, caches included.)
        if module_slot_name(name) not in taken:
            _add(slots, late, name, name in torch_caches.MODULES or _importable(name))
    slots = [s for s in slots if s.name not in taken]
    late = [name for name in late if _watched(name)[1] not in taken]  # type: ignore[index]  # watched: _add checked
    if late:
        slots.append(_late_slot(late, _watch_imports()))
    return slots


def _add(slots: list[_Slot], late: list[str], name: str, may_come: bool) -> None:
    """The watched module ``name``'s slot if it exists (and has the state),
    else ``name`` among the late ones if a rank may still import it."""
    watched = _watched(name)
    assert watched is not None
    module = sys.modules.get(name)
    if module is not None:
        slot = watched[0](module)
        if slot is not None:
            slots.append(slot)
    elif may_come:
        late.append(name)


def _watch_imports() -> Any:
    """Put the hook in place (once for concurrent runs); returns its release."""
    return patches.lease(("import hook",)).release
