"""Per-rank torch.distributed state, scoped to the threads of simulations
(docs/internals.md, "How it works").

While simulations run, c10d's one module global ``distributed_c10d._world``
is a router that gives each rank (its thread and the helper threads it
starts) its own state and leaves every other thread on the original, so a
real world used in another thread keeps working. The C++ group registry
stays process-global (its thread-isolation mode would hide a real world's
groups from its own threads): a rank's groups are registered under names
unique to their run and rank (``"1@simdist3.r0"``; c10d's bookkeeping and
store prefixes keep the plain name), so a rank can only ever unregister its
own, even a rank thread that exits late (blocked in C past its run). The
router stays until the last rank thread has left, not merely the last run.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from typing import Any, cast

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .._core.identity import me
from ..errors import SimulationError
from . import c10d_imports, patches

_install_lock = threading.Lock()
_runs = 0  # runs in progress
_live: set[RankWorldState] = set()  # rank states whose thread has not left yet
_saved: dict[str, Any] = {}
_patched: dict[str, Any] = {}  # c10d functions wrapped while routing is on
_scopes = itertools.count(1)

# Between a group's c10d name and the scope that makes it unique in the registry.
SCOPE_SEP = "@simdist"


class _GroupMap(dict):
    """c10d's map of a rank's groups. Looking up a group that a run which has
    ended made (kept in a module global, returned from its body) raises that
    run's "already ended" error, naming it, instead of c10d's "not
    initialized in the world group map"."""

    def get(self, key: Any, default: Any = None) -> Any:
        value = super().get(key, _MISSING)
        if value is not _MISSING:
            return value
        scheduler = getattr(key, "_scheduler", None)
        ended = getattr(getattr(scheduler, "_aborts", None), "closed_error", None)
        if isinstance(ended, BaseException):
            raise SimulationError(str(ended))  # its own instance: ranks raise it at once
        return default


_MISSING = object()


# The fields of ``c10d._World``, each with a rank's fresh value; those c10d
# assigns (not only mutates) are settable through the router.
_FIELDS: dict[str, Callable[[], Any]] = {
    "default_pg": lambda: None,
    "pg_map": _GroupMap,
    "pg_names": dict,
    "pg_group_ranks": dict,
    "pg_backend_config": dict,
    "group_count": int,
    "tags_to_pg": dict,
    "pg_to_tag": dict,
    "pg_coalesce_state": dict,
    "comms": list,
}
_SETTABLE = ("default_pg", "group_count")


class RankWorldState:
    """The fields of ``c10d._World`` for one rank (shared by its threads)."""

    def __init__(self, scope: str = "") -> None:
        for name, fresh in _FIELDS.items():
            setattr(self, name, fresh())
        self.scope = scope
        # Registry names this rank registered, with their groups: only these
        # may it unregister, and a caller that wipes the registry gets them back.
        self.registered: dict[str, Any] = {}


def _routed(name: str) -> property:
    def get(self: _ThreadRoutedWorld) -> Any:
        # _target() inlined: c10d reads these several times per collective.
        return getattr(me.c10d or self._original, name)

    def set_(self: _ThreadRoutedWorld, value: Any) -> None:
        setattr(self._target(), name, value)

    return property(get, set_ if name in _SETTABLE else None)


class _ThreadRoutedWorld(c10d._World):
    def __init__(self, original: c10d._World) -> None:  # no super(): state lives elsewhere
        self._original = original

    def _target(self) -> Any:
        return me.c10d or self._original


for _name in _FIELDS:
    setattr(_ThreadRoutedWorld, _name, _routed(_name))


def scoped_name(name: str) -> str:
    """The registry name of a group this thread's rank creates: c10d's own
    name (the same on every member; store prefixes use it) plus the scope
    that makes it unique in the process. Outside a rank, ``name`` itself."""
    state = me.c10d
    if state is None or SCOPE_SEP in name:
        return name
    return f"{name}{SCOPE_SEP}{state.scope}"


# -- c10d's registry functions, scoped while routing is on --------------------


def _register_process_group(name: str, pg: Any) -> None:
    name = scoped_name(name)
    _patched["_register_process_group"](name, pg)
    state = me.c10d
    if state is not None:
        state.registered[name] = pg


def _unregister_process_group(name: str) -> None:
    state = me.c10d
    if state is not None and name not in state.registered:
        return  # not this rank's: never touch another rank's or the caller's group
    _patched["_unregister_process_group"](name)
    if state is not None:
        state.registered.pop(name, None)


def _unregister_all_process_groups() -> None:
    """``destroy_process_group()`` wipes the whole registry. In a rank, wipe
    only that rank's names; elsewhere (a real world torn down in another
    thread during a run), put the live ranks' names back afterwards."""
    state = me.c10d
    if state is not None:
        for name in list(state.registered):
            _unregister_process_group(name)
        return
    _patched["_unregister_all_process_groups"]()
    with _install_lock:
        keep = [(n, pg) for s in _live for n, pg in s.registered.items()]
    for name, pg in keep:
        _patched["_register_process_group"](name, pg)


# Backends a real job names for its groups (Megatron creates a gloo twin of every
# data-parallel group): inside a rank they become simdist groups. A real gloo
# group would rendezvous over TCP in C++, blocking while it holds the run token.
_REAL_BACKENDS = {"gloo", "nccl", "ucc", "mpi", "xccl"}


def _new_process_group_helper(
    group_size: int, group_rank: int, global_ranks: Any, backend: Any, *args: Any, **kwargs: Any
) -> Any:
    asked = backend
    if me.c10d is not None and backend is not None:
        # "gloo", or a device map such as "cpu:gloo,cuda:nccl"
        names = {part.split(":")[-1].strip().lower() for part in str(backend).split(",")}
        if names <= _REAL_BACKENDS:
            backend = "simdist"
    made = _patched["_new_process_group_helper"](
        group_size, group_rank, global_ranks, backend, *args, **kwargs
    )
    if asked is not backend:
        _report_backend_as(made[0], asked)
    timeout = kwargs.get("timeout", args[3] if len(args) > 3 else None)
    simdist_world = not global_ranks and str(asked) == "simdist"  # simdist.run's own world group
    if timeout is not None and timeout != c10d.default_pg_timeout and not simdist_world:
        model = getattr(made[0], "model_timeout", None)
        if model is not None:
            model(timeout.total_seconds())
    return made


def _report_backend_as(pg: Any, asked: Any) -> None:
    """Make a simulated group report the backend the program asked for.

    Code branches on ``get_backend(group)`` (torch's ``monitored_barrier`` is
    gloo-only, object collectives pick their device by it), which reads the
    name c10d stored for the group, and on ``group._get_backend_name()``.
    """
    if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
        return
    if str(asked).lower() == "nccl" and not dist.is_nccl_available():
        # When a call on a group named "nccl" raises, c10d's error logger asks
        # torch.cuda.nccl for its version, and a torch built without NCCL raises
        # AttributeError there, hiding simdist's error: such a group keeps
        # reporting "simdist"; the sanitizer still holds it to NCCL's rules.
        getattr(pg, "asked_for_nccl", lambda: None)()
        return
    name = str(asked) if ("," in str(asked) or ":" in str(asked)) else c10d.Backend(str(asked))
    world = c10d._world
    entry = world.pg_map.get(pg)
    if entry is not None:
        world.pg_map[pg] = (name, entry[1])
    world.pg_backend_config[pg] = str(c10d.BackendConfig(cast(Any, name)))  # a device map is no Backend
    report = getattr(pg, "report_backend_as", None)
    if report is not None:
        report(str(name))


# init_method schemes whose rendezvous runs a TCP store: inside a rank, the
# run's own store instead (a TCPStore's master waits in C++ for its workers
# while it holds the run token, so the workers never run to connect).
_TCP_SCHEMES = ("env", "tcp")


def _rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs: Any) -> Any:
    world = me.world
    scheme = str(url).partition("://")[0]
    store = getattr(world, "store", None)
    if me.c10d is None or store is None or scheme not in _TCP_SCHEMES:
        return _patched["rendezvous"](url, rank, world_size, **kwargs)
    return _run_store_rendezvous(world, store, rank, world_size)


def _run_store_rendezvous(world: Any, store: Any, rank: int, world_size: int) -> Any:
    me_rank = me.rank
    with _install_lock:
        counts = world.__dict__.setdefault("_simdist_rendezvous_counts", {})
        n = counts.get(me_rank, 0)
        counts[me_rank] = n + 1
    # The n-th rendezvous of every rank shares one fresh prefix, as each
    # init would meet at a fresh TCP store.
    yield (
        dist.PrefixStore(f"simdist-rendezvous/{n}", store),
        me_rank if rank < 0 else rank,
        world.world_size if world_size < 0 else world_size,
    )


def _set_pg_timeout(timeout: Any, group: Any = None) -> None:
    """c10d's ``_set_pg_timeout`` looks for the group's gloo or NCCL backend
    object, which a simdist group does not have: such a group sets its own."""
    target = group if group is not None else (c10d._get_default_group() if me.c10d is not None else None)
    set_timeout = getattr(target, "model_timeout", None)
    if set_timeout is None:
        return _patched["_set_pg_timeout"](timeout, group)
    if c10d._rank_not_in_group(target):
        raise ValueError("Invalid process group specified")
    set_timeout(timeout.total_seconds())
    return None


_WRAPPERS = (
    (c10d, "_set_pg_timeout", _set_pg_timeout),
    (c10d, "rendezvous", _rendezvous),
    (c10d, "_new_process_group_helper", _new_process_group_helper),
    (c10d, "_register_process_group", _register_process_group),
    (c10d, "_unregister_process_group", _unregister_process_group),
    (c10d, "_unregister_all_process_groups", _unregister_all_process_groups),
)


def _route_locked() -> None:
    if "world" in _saved:
        return
    _saved["world"] = c10d._world
    c10d._world = _ThreadRoutedWorld(c10d._world)
    patches.swap_in(_patched, _WRAPPERS)
    c10d_imports.install()


def _unroute_if_idle_locked() -> None:
    if _runs or _live or "world" not in _saved:
        return
    c10d_imports.uninstall()
    # (_patched is kept: a module that imported a wrapper by name while routing
    # was on, ``from ...distributed_c10d import _register_process_group``, still calls it.)
    patches.swap_out(_patched, _WRAPPERS)
    c10d._world = _saved.pop("world")


def install() -> None:
    """Route c10d's world per rank for one run (nested/concurrent runs share it)."""
    global _runs
    with _install_lock:
        if _runs == 0:
            _saved.update(
                backend=getattr(c10d, "_backend", None),
                init_method=getattr(c10d, "_default_pg_init_method", None),
                excepthook=sys.excepthook,
            )
        _route_locked()
        _runs += 1


def uninstall() -> None:
    """A run has ended. Module globals ranks set are put back once no run is
    in progress; routing ends once no rank thread is left either."""
    global _runs
    with _install_lock:
        _runs -= 1
        if _runs == 0:
            c10d._backend = _saved.pop("backend")
            c10d._default_pg_init_method = _saved.pop("init_method")
            # init_process_group wraps sys.excepthook to prefix the rank.
            sys.excepthook = _saved.pop("excepthook")
        _unroute_if_idle_locked()


def _peel(owner: object, value: object) -> object:
    """A value found at a run's end without what ranks' c10d code set: its
    private globals are all the ranks' (None); from sys.excepthook, the
    rank-prefixing hooks init_process_group wraps around the one it found
    (a hook the caller set during the run is what is left, and stays)."""
    if owner is c10d:
        return None
    for _ in range(10_000):  # one wrapper per rank's init; bounded all the same
        code = getattr(value, "__code__", None)
        if getattr(value, "__module__", None) != c10d.__name__ or getattr(code, "co_name", "") != (
            "_distributed_excepthook"
        ):
            return value
        cells = dict(zip(code.co_freevars, getattr(value, "__closure__", None) or ()))  # type: ignore[union-attr]  # a function: it has a code object
        if "old_hook" not in cells:
            return None
        value = cells["old_hook"].cell_contents
    return None


patches.register(
    "c10d routing",
    install,
    uninstall,
    # the router, the registry wrappers, what ranks' init_process_group sets,
    # and the finder that imports torch.distributed modules unrouted (c10d_imports)
    [(c10d, "_world"), *((c10d, name) for _, name, _ in _WRAPPERS)]
    + [(c10d, "_backend"), (c10d, "_default_pg_init_method"), (sys, "excepthook"), (sys, "meta_path")],
    lambda owner, attribute, value: _peel(owner, value),
)


def new_rank_state(run_id: int, rank: int) -> RankWorldState:
    """A rank's c10d state, counted live until ``leave_rank_thread``."""
    state = RankWorldState(f"{run_id}.r{rank}")
    with _install_lock:
        _live.add(state)
    return state


def new_run_id() -> int:
    return next(_scopes)


def leave_rank_thread() -> None:
    """Forget this rank's groups: its registry names, then its c10d state."""
    state: RankWorldState | None = me.c10d
    if state is None:
        return
    try:
        for name in list(state.registered):
            try:
                _unregister_process_group(name)
            except Exception:
                pass  # already gone
    finally:
        me.c10d = None
        with _install_lock:
            _live.discard(state)
            _unroute_if_idle_locked()
