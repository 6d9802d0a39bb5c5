"""torch's thread-local settings, enumerated, and the probe that finds them.

torch keeps many settings per OS thread and exposes most as a getter/setter
pair on ``torch._C`` (``_is_view_replay_enabled``/``_set_view_replay_enabled``,
``_get_dtensor_allow_implicit_replication``/``_set_...``, grad, inference,
autocast ...). A parked rank thread (``_core.pool``) must read as new in all
of them, so ``read_toggles`` reads every pair in ``TOGGLES``; ``discover``
finds the pairs that are thread-local in the running torch by setting each in
a throwaway thread and reading it from a fresh one, so a torch release that
adds a pair is caught by a test (``tests/isolation/test_torch_tls.py``)
instead of leaking from one run into the next. ``discover`` flips process
settings for a moment: it is for tests, never called by a run.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["NAMESPACES", "TOGGLES", "discover", "missing", "read_toggles"]

# Where torch exposes its settings (a name below is looked up in one of them).
NAMESPACES: dict[str, Any] = {
    "torch._C": torch._C,
    "torch._C._autograd": torch._C._autograd,
    "torch._C._functorch": torch._C._functorch,
}

# (namespace, getter, setter): every pair ``discover`` finds thread-local on
# torch 2.13, each read with no argument.
TOGGLES: tuple[tuple[str, str, str], ...] = (
    ("torch._C", "is_grad_enabled", "_set_grad_enabled"),
    ("torch._C", "_is_fwd_grad_enabled", "_set_fwd_grad_enabled"),
    ("torch._C", "_is_multithreading_enabled", "_set_multithreading_enabled"),
    ("torch._C", "_is_view_replay_enabled", "_set_view_replay_enabled"),
    ("torch._C", "_is_grad_layout_enforcement_enabled", "_set_grad_layout_enforcement_enabled"),
    ("torch._C", "_get_dtensor_allow_implicit_replication", "_set_dtensor_allow_implicit_replication"),
    ("torch._C", "_get_graph_executor_optimize", "_set_graph_executor_optimize"),
    ("torch._C", "_meta_in_tls_dispatch_include", "_set_meta_in_tls_dispatch_include"),
    ("torch._C", "_only_lift_cpu_tensors", "_set_only_lift_cpu_tensors"),
    ("torch._C", "is_autocast_cache_enabled", "set_autocast_cache_enabled"),
    ("torch._C", "is_autocast_enabled", "set_autocast_enabled"),
    ("torch._C", "is_autocast_cpu_enabled", "set_autocast_cpu_enabled"),
    ("torch._C", "is_autocast_ipu_enabled", "set_autocast_ipu_enabled"),
    ("torch._C", "is_autocast_xla_enabled", "set_autocast_xla_enabled"),
    ("torch._C._functorch", "get_inplace_requires_grad_allowed", "set_inplace_requires_grad_allowed"),
    (
        "torch._C._functorch",
        "get_single_level_autograd_function_allowed",
        "set_single_level_autograd_function_allowed",
    ),
)


# Getters torch deprecates (each call warns), read through the device-typed
# getter that reads the same thread-local flag without a warning: a parked
# thread's state is read at every rank's end, and silencing warnings there
# (``warnings.catch_warnings``) cost most of the read and is not thread-safe.
_QUIET_AUTOCAST = {
    "is_autocast_cpu_enabled": "cpu",
    "is_autocast_ipu_enabled": "ipu",
    "is_autocast_xla_enabled": "xla",
}


def _resolved() -> list[Callable[[], Any]]:
    getters: list[Callable[[], Any]] = []
    for space, getter, _ in TOGGLES:
        found = getattr(NAMESPACES[space], getter, None)
        if found is None:  # a pair torch dropped reads as nothing (``missing`` names it)
            continue
        device = _QUIET_AUTOCAST.get(getter) if space == "torch._C" else None
        if device is not None:
            found = functools.partial(torch._C.is_autocast_enabled, device)
        getters.append(found)
    return getters


_GETTERS = _resolved()


def read_toggles() -> tuple[Any, ...]:
    """Every setting in ``TOGGLES`` as this thread reads it, warning nothing
    (``tests/isolation/test_thread_reuse_round4.py`` reads it with warnings
    as errors, against each listed getter)."""
    return tuple([get() for get in _GETTERS])


def missing() -> list[str]:
    """The pairs of ``TOGGLES`` this torch does not have."""
    return [
        f"{space}.{name}"
        for space, getter, setter in TOGGLES
        for name in (getter, setter)
        if not hasattr(NAMESPACES[space], name)
    ]


def _candidates() -> Iterator[tuple[str, str, str]]:
    """(namespace, getter, setter) for every ``set_X``/``_set_X`` with an
    ``X``-named getter beside it (``is_X``, ``get_X``, ``_is_X``, ``_get_X``, ``_X``)."""
    for space, module in NAMESPACES.items():
        names = set(dir(module))
        for setter in sorted(names):
            if not (setter.startswith("_set_") or setter.startswith("set_")):
                continue
            base = setter.split("set_", 1)[1]
            for getter in (f"_is_{base}", f"_get_{base}", f"is_{base}", f"get_{base}", f"_{base}"):
                if getter in names:
                    yield space, getter, setter
                    break


def _in_new_thread(fn: Callable[[], Any]) -> Any:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), name="simdist-tls-probe")
    thread.start()
    thread.join()
    return out[0] if out else None


def discover() -> list[tuple[str, str, str]]:
    """The boolean getter/setter pairs that are thread-local in this torch:
    set in one thread, seen there, unseen by a fresh thread and by the caller."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for space, getter, setter in _candidates():
            get = getattr(NAMESPACES[space], getter)
            put = getattr(NAMESPACES[space], setter)
            try:
                before = get()
            except Exception:
                continue  # takes an argument: not a plain setting
            if type(before) is not bool:
                continue

            def flip(get: Any = get, put: Any = put, before: bool = before) -> tuple[Any, Any] | None:
                try:
                    put(not before)
                except Exception:
                    return None  # refused on this build (no CUDA, no fp16 CPU kernels)
                try:
                    return get(), _in_new_thread(get)
                finally:
                    put(before)

            seen = _in_new_thread(flip)
            if seen is not None and seen[0] is (not before) and seen[1] is before and get() is before:
                found.append((space, getter, setter))
    return found
