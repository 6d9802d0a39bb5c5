"""What a thread keeps of torch's state for itself, read as one value.

torch keeps some modes per OS thread: every getter/setter pair of
``TOGGLES`` (grad, forward grad, view replay, DTensor's implicit replication,
autocast ...) and what ``thread_state`` reads beside them (inference mode,
autocast dtypes, the dispatch key sets, the torch-function and dispatch mode
stacks, saved tensor hooks, functorch's level, the JIT tracing state, the
current CUDA device). A rank body that leaves one set (a bare
``torch.set_grad_enabled(False)``, ``torch.set_default_device``, which pushes
a mode) would leave it to whatever runs next on its thread: a rank thread is
parked for the next run (``_core.pool``) only if ``thread_state`` reads the
same as when the thread was new (after ``forget_thread_caches``); otherwise
it ends, as every rank thread once did. What this cannot read (a C++
``thread_local`` torch does not expose) is the reason ``SIMDIST_REUSE=0``
turns reuse off (``_core.reuse``).

``discover`` finds the pairs that are thread-local in the running torch by
setting each in a throwaway thread and reading it from a fresh one, so a
torch release that adds a pair is caught by a test
(``tests/isolation/test_thread_reuse_round4.py``) instead of leaking from one
run into the next. It flips process settings for a moment: it is for tests,
never called by a run.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import profiler

__all__ = [
    "NAMESPACES",
    "TOGGLES",
    "discover",
    "forget_thread_caches",
    "missing",
    "read_toggles",
    "thread_state",
]

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


_autocast_devices = ("cpu", "cuda")


def forget_thread_caches() -> None:
    """Empty the caches torch keeps per thread that a later run must not hit:
    DTensor's native sharding-propagation cache is keyed by meshes that
    compare equal across runs (same shape, same ranks) while their groups
    are the ended run's, so a reused thread would hand a rank the last
    run's process groups."""
    torch._C._clear_DTensor_sharding_propagator_cache()
    profiler.close_left_open()  # a session left open must not profile the next run's rank


def thread_state() -> tuple[Any, ...]:
    """This thread's torch thread-local modes, as a comparable value."""
    C = torch._C
    autocast = tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _autocast_devices)
    hooks = C._autograd._top_saved_tensors_default_hooks(False)
    return (
        read_toggles(),
        torch.is_inference_mode_enabled(),
        autocast,
        C._len_torch_function_stack(),
        C._len_torch_dispatch_stack(),
        C._is_torch_function_enabled(),
        C._is_torch_function_all_disabled(),
        C._autograd._saved_tensors_hooks_is_enabled(),  # type: ignore[attr-defined]  # not in torch's stubs
        None if hooks is None else tuple(map(id, hooks)),
        str(C._dispatch_tls_local_include_set()),
        str(C._dispatch_tls_local_exclude_set()),
        torch.cuda.current_device() if torch.cuda.is_initialized() else None,
        C._get_DTensor_sharding_propagator_cache_stats(),
        C._dynamo.eval_frame.get_eval_frame_callback(),
        C._functorch.maybe_current_level(),
        C._functionalization_reapply_views_tls(),
        C._get_tracing_state(),
        C._get_thread_name(),
    )
