"""torch.distributed modules a rank imports first run against the process's c10d state.

Some of torch.distributed's modules read c10d's state when their code runs:
``torch.distributed.nn.functional`` (and ZeRO's ``_broadcast_object``,
``ShardedGradScaler``) default ``group=group.WORLD``, evaluated once, at
import. A spawned process usually imports them before ``init_process_group``
(the default is None: "the default group") or, lazily, after it (the default
is that process's own world group, which stays right for the process's life).
In simdist every rank shares the module: imported lazily inside a rank (DDP
imports ``torch.distributed.nn.functional`` on first use), the default would
be that rank's world group of that run, handed to every other rank and to
every later run ("... is not initialized in the world group map"). So while
c10d is routed, such a module's code runs with the thread's routing off: its
defaults see what the process has (normally no default group, so None), the
same in every rank and run.
"""

from __future__ import annotations

import importlib.abc
import sys
import types
from typing import Any

from .._core.identity import me
from .import_chain import spec_from_others

PREFIX = "torch.distributed."


class _ProcessStateImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(PREFIX) or me.c10d is None:
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is None:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Unrouted(spec.loader)
        return spec


class _Unrouted(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # Look like an ordinary import afterwards (reload, resources).
        spec = module.__spec__
        assert spec is not None  # the import system sets it before exec_module
        module.__loader__ = spec.loader = self.loader
        state, me.c10d = me.c10d, None
        try:
            self.loader.exec_module(module)
        finally:
            me.c10d = state


FINDER = _ProcessStateImports()


def install() -> None:
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)


def uninstall() -> None:
    if FINDER in sys.meta_path:
        sys.meta_path.remove(FINDER)
