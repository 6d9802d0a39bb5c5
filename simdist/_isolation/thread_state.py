"""What a thread keeps of torch's state for itself, read as one value.

torch keeps some modes per OS thread: every getter/setter pair of
``torch_tls.TOGGLES`` (grad, forward grad, view replay, DTensor's implicit
replication, autocast ...; a test checks the list against what the running
torch keeps per thread), and what this module reads beside them (inference
mode, autocast dtypes, the dispatch key sets, the torch-function and dispatch
mode stacks, saved tensor hooks, functorch's level, the JIT tracing state,
the current CUDA device). A rank body that leaves one set (a
bare ``torch.set_grad_enabled(False)``, ``torch.set_default_device``, which
pushes a mode) would leave it to whatever runs next on its thread: a rank
thread is parked for the next run (``_core.pool``) only if this reads the
same as when the thread was new (after ``forget_thread_caches``); a thread
whose value differs is not parked but ends, as every rank thread once did.
What this cannot read (a C++ ``thread_local`` torch does not expose) is the
reason ``SIMDIST_REUSE=0`` turns reuse off (``_core.reuse``).
"""

from __future__ import annotations

from typing import Any

import torch

from . import profiler, torch_tls

__all__ = ["forget_thread_caches", "thread_state"]

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
        torch_tls.read_toggles(),
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
