"""A pytest plugin for benchmarks/pytorch_suites.py: modules an older
PyTorch test file imports that the installed torch no longer has, stood in
for by names that raise when used, so the file imports and its other tests
run. A test that uses one fails natively and on simdist alike, so it never
counts as a difference. Loaded with ``-p _removed_names`` both ways.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# module -> names the files import from it (torch 2.13 removed torch.distributed._spmd)
REMOVED = {"torch.distributed._spmd.comm_tensor": ("_wait_comm", "CommTensor")}


def _removed(module: str, name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{module}.{name} does not exist in this torch (stood in for by the benchmark)")

    if name[:1].isupper():
        return type(name, (), {"__init__": unavailable, "__new__": unavailable})
    return unavailable


def _install() -> None:
    for module, names in REMOVED.items():
        try:
            importlib.import_module(module)
            continue
        except ImportError:
            pass
        parts = module.split(".")
        for i in range(len(parts) - 1, 0, -1):
            parent = ".".join(parts[:i])
            try:
                importlib.import_module(parent)
                break
            except ImportError:
                continue
        for j in range(i + 1, len(parts) + 1):
            name = ".".join(parts[:j])
            if name in sys.modules:
                continue
            stub = types.ModuleType(name)
            sys.modules[name] = stub
            setattr(sys.modules[".".join(parts[: j - 1])], parts[j - 1], stub)
        for attr in names:
            setattr(sys.modules[module], attr, _removed(module, attr))


_install()
