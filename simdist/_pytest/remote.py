"""Finding a test function in a rank process of a real world.

The test module is loaded from its file, with pytest's assertion rewriting
when it is available, so a failed ``assert`` in a gloo or NCCL rank explains
itself as it would in the simulator. Loading by file (not by pickled
reference) works whatever ``sys.path`` the process pool was started with.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Callable
from typing import Any

_loaded: dict[str, types.ModuleType] = {}


def load_test(module_name: str, path: str, root: str, qualname: str) -> Callable[..., Any]:
    module = _loaded.get(path)
    if module is None:
        module = _loaded[path] = _load_module(module_name, path, root)
    obj: Any = module
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        obj = getattr(obj, part)
        if isinstance(obj, type) and i < len(parts) - 1:
            obj = obj()  # a test class: pytest makes a fresh instance per test too
    return obj


def _load_module(name: str, path: str, root: str) -> types.ModuleType:
    # The test module's own imports (helpers beside it) resolve as under pytest's
    # default "prepend" import mode.
    if root not in sys.path:
        sys.path.insert(0, root)
    with open(path, "rb") as fh:
        source = fh.read()
    tree = ast.parse(source, filename=path)
    try:
        from _pytest.assertion.rewrite import rewrite_asserts

        rewrite_asserts(tree, source, path, None)
    except Exception:
        pass
    module = types.ModuleType(name)
    module.__file__ = path
    module.__package__ = name.rpartition(".")[0]
    sys.modules[name] = module
    exec(compile(tree, path, "exec", dont_inherit=True), module.__dict__)
    return module
