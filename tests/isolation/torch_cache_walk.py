"""Run by tests/isolation/test_torch_caches.py in a fresh interpreter: imports every
torch.distributed module that imports here, walks them and prints, as JSON, every
cache-like object found: module-level and class-level ``functools`` cache
wrappers, dicts and weak dicts, ``threading.local`` objects, and the same inside
module-level singletons (instances of torch.distributed classes), one level down.
Each object is listed once, under every name it is reachable by."""

import enum
import functools
import importlib
import json
import pkgutil
import sys
import threading
import types
import warnings
import weakref

import torch.distributed

_CACHE_TYPES = (dict, weakref.WeakKeyDictionary, weakref.WeakValueDictionary, threading.local)
# Bookkeeping every enum class and namedtuple carries: their members, fixed at import.
_TYPE_INTERNALS = {"_member_map_", "_value2member_map_", "_field_defaults"}


def _cache_kind(value):
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, functools._lru_cache_wrapper):
        return "lru_cache"
    for kind in _CACHE_TYPES:
        if isinstance(value, kind):
            return kind.__name__
    return None


def _ours(value):
    return getattr(type(value), "__module__", "").startswith("torch.distributed")


def _singleton_attrs(obj, prefix, found, depth):
    """Cache-like attributes of a module-level instance (a dispatcher, a registry)."""
    try:
        attrs = vars(obj)
    except TypeError:
        return
    for name, value in list(attrs.items()):
        where = f"{prefix}.{name}"
        kind = _cache_kind(value)
        if kind is not None:
            found.setdefault(id(value), (kind, value, set()))[2].add(where)
        elif depth and _ours(value) and not isinstance(value, (type, enum.Enum)):
            _singleton_attrs(value, where, found, depth - 1)


def walk():
    warnings.simplefilter("ignore")
    not_imported = []
    for info in pkgutil.walk_packages(torch.distributed.__path__, "torch.distributed."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # optional dependencies missing (pulp, tabulate, ...)
            not_imported.append(f"{info.name}: {type(exc).__name__}")
    found = {}
    names = sorted(n for n, m in sys.modules.items() if n.startswith("torch.distributed") and m is not None)
    for module_name in names:
        module = sys.modules[module_name]
        for name, value in list(vars(module).items()):
            if name.startswith("__"):
                continue
            where = f"{module_name}.{name}"
            kind = _cache_kind(value)
            if kind is not None:
                found.setdefault(id(value), (kind, value, set()))[2].add(where)
            elif isinstance(value, type) and value.__module__ == module_name:
                for attr, member in list(vars(value).items()):
                    if attr.startswith("__") or attr in _TYPE_INTERNALS:
                        continue
                    kind = _cache_kind(member)
                    if kind is not None:
                        found.setdefault(id(member), (kind, member, set()))[2].add(f"{where}.{attr}")
                    elif _ours(member) and not isinstance(member, (type, enum.Enum, types.FunctionType)):
                        _singleton_attrs(member, f"{where}.{attr}", found, 1)
            elif _ours(value) and not isinstance(value, (enum.Enum, types.ModuleType, types.FunctionType)):
                _singleton_attrs(value, where, found, 1)
    caches = sorted(
        ({"kind": kind, "names": sorted(where)} for kind, _, where in found.values()),
        key=lambda c: c["names"][0],
    )
    return {"caches": caches, "not_imported": not_imported}


if __name__ == "__main__":
    json.dump(walk(), sys.stdout, indent=1)
