"""Process-wide state of torch and Megatron-core that is rank-local without asking.

Third-party code keeps some state once per process. On a cluster every rank has
its own copy; in simdist the rank threads share one, so such state is swapped at
every token switch (see ``rank_state``), exactly like ``rank_local=`` entries,
but without the user having to know it exists. Only state that makes real,
unmodified code fail or give wrong results when shared is listed here:

* DTensor's op dispatcher keeps a dict of custom op handlers on a class
  attribute (``DTensor._op_dispatcher._custom_op_handlers``). ``loss_parallel()``
  adds the loss ops to it on entry and pops them on exit: with shared state the
  first rank to leave removes them from under its peers (their backward then
  runs without the handlers) and the second one's exit fails with
  ``KeyError: aten._log_softmax.default``. Each rank gets its own contents; the
  dict object stays the same (torch's C++ dispatch reads it).
* DTensor's random-op tracker (``torch.distributed.tensor._random._rng_tracker``)
  is created by a process's first random op on a DTensor and holds that
  process's generator offsets.
* torch.distributed's caches whose keys are equal across ranks while their
  values are rank-specific (DTensor's redistribute planner, ...): each rank
  starts with empty ones (the audit and its reasons: ``torch_caches``).
* ``torch.nn``'s global module hooks (``register_module_forward_pre_hook``
  and family, ``torch.nn.modules.module._global_*``): module-tracking tools
  (``ModTracker``, which ``CommDebugMode`` uses) register them per process;
  shared, a rank's hooks see its peers' modules enter and leave between
  collectives ("The Module hierarchy tracking is wrong"). Each rank starts
  from the run-start hooks (its own dicts, the same hook functions).
* c10d's backend registry (``Backend.register_backend`` fills
  ``Backend.backend_list``, ``_plugins`` and the device and capability
  maps): a rank that registers a backend registers it in its own process,
  so a peer asking ``is_backend_available`` before registering it gets False.
* Megatron-core keeps its process groups, ranks and buffers in the module globals
  of ``megatron.core.parallel_state``: ``initialize_model_parallel`` on a
  second rank fails with "... is already initialized", and every getter would
  return the last rank's groups. ``megatron.core.tensor_parallel.random`` keeps
  the model-parallel RNG tracker (per-rank seeds) in module globals too.

Megatron's modules are rank-local whether the process imported them before the
run or a rank imports them during it (importing Megatron costs seconds, so a run
never imports it itself). For the second case an import hook, in place only
while such a run lasts, keeps the module's globals as they are right after its
code ran: every other rank starts from those, as a process importing it would,
and the caller gets them back when the run ends. DTensor's state counts only if
``torch.distributed.tensor`` was imported before the run.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any

from . import patches, torch_caches
from .import_chain import spec_from_others
from .slots import _attr_slot, _module_slot, _Slot, attr_slot_name, module_slot_name

# Megatron-core modules whose globals are process state (see the module doc).
MEGATRON_MODULES = ("megatron.core.parallel_state", "megatron.core.tensor_parallel.random")


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


def _dtensor_api_slot(module: types.ModuleType) -> _Slot:
    return _dtensor_handlers_slot(module.DTensor._op_dispatcher)


def _dtensor_tracker_slot(module: types.ModuleType) -> _Slot:
    return _attr_slot(module, "_rng_tracker")


# Modules whose state is rank-local by default, with the slot that swaps it
# once the module exists (see the module doc).
_DTENSOR_WATCHED: dict[str, Callable[[types.ModuleType], _Slot]] = {
    "torch.distributed.tensor._api": _dtensor_api_slot,
    "torch.distributed.tensor._random": _dtensor_tracker_slot,
}


def _watched(name: str) -> Callable[[types.ModuleType], _Slot] | None:
    """The slot maker of a watched module (``MEGATRON_MODULES`` read now: tests swap it)."""
    if name in _DTENSOR_WATCHED:
        return _DTENSOR_WATCHED[name]
    if name in torch_caches.MODULES:
        return torch_caches.module_slot
    return _module_slot if name in MEGATRON_MODULES else None


class _FreshGlobals(importlib.abc.MetaPathFinder):
    """Records a watched module's state right after its code has run."""

    def __init__(self) -> None:
        self.fresh: dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if _watched(fullname) is None:
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is None:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Recording(spec.loader, self.fresh)
        return spec


class _Recording(importlib.abc.Loader):
    def __init__(self, loader: Any, fresh: dict[str, Any]) -> None:
        self.loader = loader
        self.fresh = fresh

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # Look like an ordinary import afterwards (reload, resources).
        spec = module.__spec__
        assert spec is not None  # the import system sets it before exec_module
        module.__loader__ = spec.loader = self.loader
        self.loader.exec_module(module)
        make = _watched(module.__name__)
        assert make is not None  # only watched modules get this loader
        slot = make(module)
        # A copy: the importing rank goes on to change the live objects in place.
        self.fresh[module.__name__] = slot.copy(slot.get())


_fresh_globals = _FreshGlobals()
_installed: dict[str, bool] = {}  # top-level package -> importable (looked up once)


def install_import_hook() -> None:
    sys.meta_path.insert(0, _fresh_globals)


def remove_import_hook() -> None:
    if _fresh_globals in sys.meta_path:
        sys.meta_path.remove(_fresh_globals)


patches.register("import hook", install_import_hook, remove_import_hook, [(sys, "meta_path")])


def _watch_imports() -> Any:
    """Put the hook in place (once for concurrent runs); returns its release."""
    return patches.lease(("import hook",)).release


_NOT_YET = object()  # a rank's value for a module that did not exist at run start


def _late_module_slot(name: str, release: Any, bound: list[bool] | None = None) -> _Slot:
    """A module a rank may import during the run. Until then there is nothing
    to swap; afterwards each rank whose value is still ``_NOT_YET`` gets a copy
    of the fresh state, as its own first import would have given it. Once it
    exists it is always read (no fingerprint): only in runs that imported it.
    ``bound`` (shared by ``_late_modules_slot``'s parts) records that some
    part has found its module."""
    inner: list[_Slot] = []

    def module_slot() -> _Slot | None:
        if not inner:
            module = sys.modules.get(name)
            if module is None or name not in _fresh_globals.fresh:
                return None
            make = _watched(name)
            assert make is not None
            inner.append(make(module))
            if bound is not None:
                bound[0] = True
        return inner[0]

    def fingerprint() -> Any:
        # Vouches only while the module does not exist (costs a lookup a switch).
        return _NOT_YET if not inner and name not in sys.modules else None

    def get() -> Any:
        slot = module_slot()
        return _NOT_YET if slot is None else slot.get()

    def set_(value: Any) -> None:
        slot = module_slot()
        if slot is not None:
            slot.set(slot.copy(_fresh_globals.fresh[name]) if value is _NOT_YET else value)

    if name in MEGATRON_MODULES:
        slot_name = module_slot_name(name)
    else:
        slot_name = _DTENSOR_NAMES.get(name) or torch_caches.slot_name(name)
    return _Slot(slot_name, get, set_, lambda v: v, fingerprint, close=release)


def _late_modules_slot(parts: list[_Slot], names: frozenset[str], bound: list[bool], release: Any) -> _Slot:
    """The late modules of a run as one slot: while none of them exists, one
    look at ``sys.modules`` vouches for them all at a switch (instead of a
    fingerprint call each); once one does, every part is read and written as
    its own slot would be. A part's value stays ``_NOT_YET`` until its module
    exists, and its copy is the value itself, so ranks share one tuple
    until then."""

    def get() -> tuple[Any, ...]:
        return tuple(part.get() for part in parts)

    def set_(values: tuple[Any, ...]) -> None:
        for part, value in zip(parts, values):
            part.set(value)

    def copy_(values: tuple[Any, ...]) -> tuple[Any, ...]:
        copied = tuple(part.copy(v) for part, v in zip(parts, values))
        return values if all(c is v for c, v in zip(copied, values)) else copied

    def fingerprint() -> Any:
        # Importing a module puts it in sys.modules; a part that has found its
        # module must be read even if the module left sys.modules since. The
        # keys view's isdisjoint walks the smaller side (the few names); a
        # set's walks the dict it is given (every module: ~30 us a switch).
        return _NOT_YET if not bound[0] and sys.modules.keys().isdisjoint(names) else None

    return _Slot(
        "modules a rank may import: " + ", ".join(part.name for part in parts),
        get,
        set_,
        copy_,
        fingerprint,
        close=release,
    )


_DTENSOR_NAMES = {
    "torch.distributed.tensor._api": "OpDispatcher._custom_op_handlers",
    "torch.distributed.tensor._random": "torch.distributed.tensor._random._rng_tracker",
}


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


def _module_hooks_slot() -> _Slot | None:
    """torch.nn's global module hooks as one slot (one read a switch, not ten):
    Module._call_impl looks each dict up by its global name at call time."""
    module = sys.modules.get(_NN_MODULE)
    names = tuple(n for n in _HOOK_GLOBALS if module is not None and hasattr(module, n))
    if module is None or not names:
        return None
    space = vars(module)

    def get() -> tuple[Any, ...]:
        return tuple(space[n] for n in names)

    def set_(value: tuple[Any, ...]) -> None:
        space.update(zip(names, value, strict=True))

    def copy_(value: tuple[Any, ...]) -> tuple[Any, ...]:
        # each rank its own dicts; the hooks in them are the same functions
        return tuple(v.copy() if isinstance(v, dict) else v for v in value)

    lookup = space.__getitem__
    # Read at every switch: builtins only (a generator costs a call per item).
    return _Slot(
        f"module {_NN_MODULE}'s global hooks", get, set_, copy_, lambda: tuple(map(id, map(lookup, names)))
    )


_BACKEND_TABLES = (
    "backend_list",
    "_plugins",
    "default_device_backend_map",
    "backend_capability",
    "backend_type_map",
)


def _backend_registry_slot() -> _Slot | None:
    """c10d's backend registry tables, each rank its own copies (one slot)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    kind = getattr(c10d, "Backend", None)
    if kind is None:
        return None
    names = tuple(n for n in _BACKEND_TABLES if isinstance(getattr(kind, n, None), list | dict))

    def get() -> tuple[Any, ...]:
        return tuple(getattr(kind, n) for n in names)

    def set_(value: tuple[Any, ...]) -> None:
        for n, v in zip(names, value, strict=True):
            setattr(kind, n, v)

    def copy_(value: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(v.copy() for v in value)

    lookup = vars(kind).__getitem__
    # Read at every switch: builtins only (a generator costs a call per item).
    return _Slot("c10d's backend registry", get, set_, copy_, lambda: tuple(map(id, map(lookup, names))))


def default_slots(taken: set[str]) -> list[_Slot]:
    """Slots for the default rank-local state the process holds now, leaving
    out any the caller already listed in ``rank_local`` (names in ``taken``)."""
    slots: list[_Slot] = []
    late = []
    api = sys.modules.get("torch.distributed.tensor._api")
    if api is not None and hasattr(api, "DTensor"):
        dispatcher = api.DTensor._op_dispatcher
        if isinstance(getattr(dispatcher, "_custom_op_handlers", None), dict):
            slots.append(_dtensor_handlers_slot(dispatcher))
    elif api is None and "torch.distributed.tensor" not in sys.modules:
        # A rank may import DTensor first (a test module that imports lazily):
        # its handler table must still be each rank's own.
        late.append("torch.distributed.tensor._api")
    tracker_module = sys.modules.get("torch.distributed.tensor._random")
    if tracker_module is not None and hasattr(tracker_module, "_rng_tracker"):
        slots.append(_attr_slot(tracker_module, "_rng_tracker"))
    elif tracker_module is None and "torch.distributed.tensor" not in sys.modules:
        late.append("torch.distributed.tensor._random")
    for extra in (_module_hooks_slot(), _backend_registry_slot()):
        if extra is not None:
            slots.append(extra)
    for name in torch_caches.MODULES:
        # (A module the caller lists in rank_local is swapped whole, caches included.)
        if module_slot_name(name) in taken:
            continue
        module = sys.modules.get(name)
        if module is not None:
            slots.append(torch_caches.module_slot(module))
        else:
            late.append(name)
    for name in MEGATRON_MODULES:
        if module_slot_name(name) in taken:
            continue
        module = sys.modules.get(name)
        if module is not None:
            slots.append(_module_slot(module))
        elif _importable(name):
            late.append(name)
    slots = [s for s in slots if s.name not in taken]
    if late:
        release = _watch_imports()
        bound = [False]
        parts = [_late_module_slot(name, release, bound) for name in late]
        kept = [(name, part) for name, part in zip(late, parts) if part.name not in taken]
        if kept:
            names = frozenset(name for name, _ in kept)
            slots.append(_late_modules_slot([part for _, part in kept], names, bound, release))
        else:
            release()  # nothing left to watch for
    return slots
