"""simdist's own ``sys.meta_path`` finders: each wraps the loader the rest of the chain finds.

They do not find modules themselves: each asks the other finders for the
spec and wraps its loader (``rank_local_defaults`` records a watched module's
fresh globals, ``c10d_imports`` runs torch.distributed modules against the
process's c10d state). Two such finders that both want a module (DTensor's
``_api`` is both) would ask each other for ever; each lookup instead asks
every finder at most once, so the second finder gets the real spec and both
wrappers apply.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
import types
from typing import Any

__all__ = ["WrappingFinder", "WrappingLoader", "spec_from_others"]

_asking = threading.local()  # ids of the finders in the middle of a lookup on this thread


def spec_from_others(finder: object, fullname: str, path: Any, target: Any = None) -> Any:
    """The first spec for ``fullname`` from the finders on ``sys.meta_path``
    other than ``finder`` and those already asking in this lookup; None if none has one."""
    busy: set[int] = _asking.__dict__.setdefault("ids", set())
    busy.add(id(finder))
    try:
        for other in sys.meta_path:
            if id(other) in busy or not hasattr(other, "find_spec"):
                continue
            spec = other.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return None
    finally:
        busy.discard(id(finder))


class WrappingLoader(importlib.abc.Loader):
    """A found loader, wrapped: ``run`` executes the module's code."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # Look like an ordinary import afterwards (reload, resources).
        spec = module.__spec__
        assert spec is not None  # the import system sets it before exec_module
        module.__loader__ = spec.loader = self.loader
        self.run(module)

    def run(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)


class WrappingFinder(importlib.abc.MetaPathFinder):
    """For the modules ``wants`` accepts, the others' spec with its loader wrapped in ``wrapper``."""

    wrapper: type[WrappingLoader] = WrappingLoader

    def wants(self, fullname: str) -> bool:
        raise NotImplementedError

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not self.wants(fullname):
            return None
        spec = spec_from_others(self, fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = self.wrapper(spec.loader)
        return spec
