"""Per-rank-thread torch.distributed state.

c10d keeps its world (default group, group maps, name counter) in one module
global, ``distributed_c10d._world``, and its C++ group-name registry is
process-global. While simulations run we swap that global for a router that
gives each rank thread its own state and leaves every other thread (the main
thread included) on the original; C++ thread-isolation mode gives each thread
its own name registry. Everything is put back when the last simulation ends.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import _set_thread_isolation_mode

_tls = threading.local()
_install_lock = threading.Lock()
_installs = 0
_saved: dict[str, Any] = {}


class RankWorldState:
    """The fields of ``c10d._World`` for one rank thread."""

    def __init__(self) -> None:
        self.default_pg: Any = None
        self.pg_map: dict = {}
        self.pg_names: dict = {}
        self.pg_group_ranks: dict = {}
        self.pg_backend_config: dict = {}
        self.group_count = 0
        self.tags_to_pg: dict = {}
        self.pg_to_tag: dict = {}
        self.pg_coalesce_state: dict = {}
        self.comms: list = []


def _routed(name: str, settable: bool = False) -> property:
    def get(self: "_ThreadRoutedWorld") -> Any:
        return getattr(self._target(), name)

    def set_(self: "_ThreadRoutedWorld", value: Any) -> None:
        setattr(self._target(), name, value)

    return property(get, set_ if settable else None)


class _ThreadRoutedWorld(c10d._World):
    def __init__(self, original: c10d._World) -> None:  # no super(): state lives elsewhere
        self._original = original

    def _target(self) -> Any:
        return getattr(_tls, "state", None) or self._original

    default_pg = _routed("default_pg", settable=True)
    pg_map = _routed("pg_map")
    pg_names = _routed("pg_names")
    pg_group_ranks = _routed("pg_group_ranks")
    pg_backend_config = _routed("pg_backend_config")
    group_count = _routed("group_count", settable=True)
    tags_to_pg = _routed("tags_to_pg")
    pg_to_tag = _routed("pg_to_tag")
    pg_coalesce_state = _routed("pg_coalesce_state")
    comms = _routed("comms")


def install() -> None:
    """Route c10d's world per thread (nested/concurrent runs share one install)."""
    global _installs
    with _install_lock:
        if _installs == 0:
            _saved.update(
                world=c10d._world,
                backend=getattr(c10d, "_backend", None),
                init_method=getattr(c10d, "_default_pg_init_method", None),
                excepthook=sys.excepthook,
            )
            c10d._world = _ThreadRoutedWorld(c10d._world)
            _saved["new_pg_helper"] = c10d._new_process_group_helper
            c10d._new_process_group_helper = _simulated_backends(c10d._new_process_group_helper)
            _set_thread_isolation_mode(True)
        _installs += 1


def uninstall() -> None:
    """Undo ``install`` once the last simulation using it has ended."""
    global _installs
    with _install_lock:
        _installs -= 1
        if _installs == 0:
            _set_thread_isolation_mode(False)
            c10d._world = _saved["world"]
            c10d._new_process_group_helper = _saved["new_pg_helper"]
            c10d._backend = _saved["backend"]
            c10d._default_pg_init_method = _saved["init_method"]
            # init_process_group wraps sys.excepthook to prefix the rank.
            sys.excepthook = _saved["excepthook"]
            _saved.clear()


# Backends a real job names for its groups (Megatron creates a gloo twin of every
# data-parallel group): inside a rank they become simdist groups. A real gloo
# group would rendezvous over TCP in C++, blocking while it holds the run token.
_REAL_BACKENDS = {"gloo", "nccl", "ucc", "mpi", "xccl"}


def _simulated_backends(helper: Any) -> Any:
    def new_process_group_helper(group_size: int, group_rank: int, global_ranks: Any, backend: Any,
                                 *args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "state", None) is not None and backend is not None:
            # "gloo", or a device map such as "cpu:gloo,cuda:nccl"
            names = {part.split(":")[-1].strip().lower() for part in str(backend).split(",")}
            if names <= _REAL_BACKENDS:
                backend = "simdist"
        return helper(group_size, group_rank, global_ranks, backend, *args, **kwargs)

    return new_process_group_helper


def enter_rank_thread() -> RankWorldState:
    state = RankWorldState()
    _tls.state = state
    return state


def leave_rank_thread() -> None:
    """Forget this thread's groups, in c10d and in this thread's C++ registry."""
    state: RankWorldState | None = getattr(_tls, "state", None)
    if state is None:
        return
    try:
        for pg in list(state.pg_names):
            try:
                c10d._unregister_process_group(state.pg_names[pg])
            except Exception:
                pass  # never registered (init failed half-way)
    finally:
        _tls.state = None
