"""torch.distributed's process-wide caches, audited: which must be each rank's
own (docs/torch-state.md, "torch.distributed's caches").

A cache is harmless shared when its value depends only on its key; it gives
silent wrong answers when its keys compare equal across ranks (a
``DeviceMesh`` does: same shape, same ranks) while its values are
rank-specific. Every cache-like object torch.distributed keeps at module or
class level is in exactly one table below, and
``tests/isolation/test_torch_caches.py`` fails on one in none:

* ``PER_RANK``: each rank gets its own, empty at run start (``module_slot``,
  swapped by ``rank_state``). A cache is swapped by rebinding its name, which
  reaches every caller because torch looks each one up by that name at call
  time; a dict of ``torch.distributed`` itself (``IN_PLACE``) has its
  contents swapped instead, so the package's own namespace is never rebound
  during a run (what the patch registry's test watches).
* ``OWN_ALREADY``: each rank's by other means (thread-locals, the c10d
  router of ``c10d_state``, the handler-table slot).
* ``RANK_INDEPENDENT``: registries filled at import, constant tables, caches
  whose value depends only on the key, warn-once memos.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from .slots import _Slot

__all__ = ["MODULES", "OWN_ALREADY", "PER_RANK", "RANK_INDEPENDENT", "fresh_cache", "module_slot"]


def _each(reason: str, *names: str) -> dict[str, str]:
    return dict.fromkeys(names, reason)


_TD = "torch.distributed"
_DT = "torch.distributed.tensor"

# (module, attribute path in it, why its values are rank-specific)
PER_RANK: tuple[tuple[str, str, str], ...] = (
    (
        f"{_DT}._redistribute",
        "_gen_transform_infos",
        "keyed by (src spec, dst spec), equal on every rank; each _TransformInfo's logical_shape "
        "is the local shape at this rank's mesh coordinate (uneven shards differ per rank)",
    ),
    (
        f"{_DT}._redistribute",
        "_planner_cache",
        "keyed by (weakref to the mesh, TensorMeta): weak references compare by their meshes, "
        "equal across ranks; the planner holds the mesh of the rank that made it",
    ),
    (
        f"{_DT}._collective_utils",
        "MeshTopoInfo.build_from_mesh",
        "keyed by the mesh (equal across ranks); the MeshTopoInfo holds the first caller's mesh",
    ),
    (
        _TD,
        "_breakpoint_cache",
        "dist.breakpoint(skip=n) counts the calls of this process: each rank counts its own",
    ),
    (
        f"{_TD}._symmetric_memory",
        "_group_name_to_store",
        "keyed by group name (c10d's name, the same on every member); the store is the rank's",
    ),
    (
        f"{_TD}._symmetric_memory",
        "_group_name_to_workspace_tensor",
        "keyed by group name (the same on every member); the workspace is the rank's",
    ),
)

IN_PLACE = frozenset({(_TD, "_breakpoint_cache")})

MODULES: tuple[str, ...] = tuple(dict.fromkeys(module for module, _, _ in PER_RANK))

OWN_ALREADY: dict[str, str] = {
    **_each(
        "a threading.local: each rank thread has its own (a helper thread starts empty)",
        f"{_TD}.device_mesh._mesh_resources",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding",
        f"{_DT}._utils.ExplicitRedistributionContext._local",
        f"{_TD}._local_tensor.LocalRunnerMode.runner_context",
        f"{_TD}._local_tensor._THREAD_LOCAL_TENSOR_MODE",
        f"{_TD}.rpc.api._thread_local_var",
        f"{_TD}.rpc.internal._thread_local_tensor_tables",
    ),
    **_each(
        "c10d's group maps: c10d reads them through distributed_c10d._world, which simdist "
        "routes to each rank's own state (_isolation/c10d_state)",
        f"{_TD}.distributed_c10d._pg_map",
        f"{_TD}.distributed_c10d._pg_names",
        f"{_TD}.distributed_c10d._pg_group_ranks",
        f"{_TD}.distributed_c10d._pg_backend_config",
        f"{_TD}.distributed_c10d._tags_to_pg",
        f"{_TD}.distributed_c10d._pg_to_tag",
        f"{_TD}.distributed_c10d._world._pg_coalesce_state",
    ),
    f"{_DT}.DTensor._op_dispatcher._custom_op_handlers": (
        "swapped per rank by rank_local_defaults (loss_parallel edits it)"
    ),
    **_each(
        "keyed by objects each rank creates itself (modules, tensors): keys never equal across ranks",
        f"{_TD}._composable_state._module_state_mapping",
        f"{_TD}.fsdp._common_utils._MODULE_TO_INP_DTYPE",
    ),
}

RANK_INDEPENDENT: dict[str, str] = {
    **_each(
        "a constant table written at import (a validation tool's list of ops to skip, with the reason)",
        f"{_DT}._ops.strategy_validation.SKIP_OPS",
    ),
    **_each(
        "a registry of ops, handlers or classes filled at import (or by explicit registration "
        "that every rank makes alike)",
        f"{_TD}._composable.replicate_with_fsdp.cls_to_replicate_cls",
        f"{_TD}._dist2._BACKENDS",
        f"{_TD}._meta_registrations._META_FUNCTIONS",
        f"{_TD}._shard.checkpoint._experimental.barriers.BARRIER_REGISTRY",
        f"{_TD}._shard.checkpoint._state_dict_stager.dispatch_table",
        f"{_TD}._shard.sharded_tensor._CUSTOM_SHARDED_OPS",
        f"{_TD}._shard.sharded_tensor._SHARDED_OPS",
        f"{_TD}._shard.sharded_tensor._ops.init.tensor_like_creation_op_map",
        f"{_TD}._shard.sharding_spec.api._CUSTOM_SHARDING_SPEC_OPS",
        f"{_TD}._sharded_tensor._ops.init.tensor_like_creation_op_map",
        f"{_TD}._sharded_tensor.api._CUSTOM_SHARDED_OPS",
        f"{_TD}._sharded_tensor.api._SHARDED_OPS",
        f"{_TD}._sharding_spec.api._CUSTOM_SHARDING_SPEC_OPS",
        f"{_TD}._symmetric_memory._nvshmem_triton.NvshmemKernelRegistry._to_init",
        f"{_TD}._symmetric_memory._rocshmem_triton.RocshmemKernelRegistry._to_init",
        f"{_TD}._symmetric_memory._shmem_triton_utils.ShmemKernelRegistry._to_init",
        f"{_TD}.algorithms._optimizer_overlap.optimizer_overlap._registered_overlapped_optims",
        f"{_TD}.checkpoint._experimental.barriers.BARRIER_REGISTRY",
        f"{_TD}.distributed_c10d.Backend._plugins",
        f"{_TD}.elastic.rendezvous.registry.handler_registry._registry",
        f"{_TD}.fsdp._fully_shard._fully_shard.cls_to_fsdp_cls",
        f"{_TD}.rendezvous._rendezvous_handlers",
        f"{_TD}.rpc.api._default_pickler._class_reducer_dict",
        f"{_TD}.rpc.api._default_pickler._dispatch_table",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_to_rules",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_to_scalar_shape_adjuster",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_to_schema_info",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_to_schema_info_for_single_dim_strategy",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.op_to_shape_and_stride_idx",
        f"{_DT}.DTensor._op_dispatcher.sharding_propagator.squeeze_op_to_dims_variant",
        f"{_DT}._decompositions.decomposition_table",
        f"{_DT}.debug._op_coverage.inductor_decomps",
        f"{_DT}.experimental._context_parallel._attention._replaced_functions",
        f"{_DT}.experimental._context_parallel._attention.custom_ops",
        f"{_DT}.experimental._context_parallel._sharding_rules._cp_strategy_contexts",
        f"{_DT}.experimental._context_parallel._sharding_rules._original_strategies",
        f"{_DT}.parallel.loss.customized_loss_ops",
    ),
    **_each(
        "a constant table",
        f"{_TD}._functional_collectives.REDUCE_OP_TO_STR",
        f"{_TD}._functional_collectives.traceable_collective_remaps",
        f"{_TD}._shard.checkpoint._hf_utils.DTYPE_MAP",
        f"{_TD}.checkpoint._hf_utils.DTYPE_MAP",
        f"{_TD}.distributed_c10d.Backend.backend_capability",
        f"{_TD}.distributed_c10d.Backend.backend_type_map",
        f"{_TD}.distributed_c10d.Backend.default_device_backend_map",
        f"{_TD}.distributed_c10d.reduce_op.__members__",
        f"{_TD}.elastic.multiprocessing.errors._EMPTY_ERROR_DATA",
        f"{_TD}.elastic.multiprocessing.redirects._WIN32_STD_HANDLE",
        f"{_TD}.elastic.rendezvous.dynamic_rendezvous.RendezvousTimeout._DEFAULT_TIMEOUTS",
        f"{_TD}.fsdp.FlatParameter.__annotations__",
        f"{_TD}.fsdp._init_utils.SHARDING_STRATEGY_MAP",
        f"{_TD}.optim.utils.functional_optim_map",
        f"{_TD}.pipelining._schedule_visualizer.action_type_to_color_mapping",
        f"{_TD}._tensor.placement_types.dtype_abbrs",
        f"{_DT}._nonlinear_redux._ARGMINMAX_REDUCTION_OPS",
        f"{_DT}._ops.ARGMAX_ARGMIN_OPS",
        f"{_DT}._ops.LINEAR_REDUCTION_OP_MAP",
        f"{_DT}._ops.POOL_SPATIAL_RANK",
        f"{_DT}._ops._math_ops._LINALG_NUM_PLACEMENTS",
        f"{_DT}._ops.dim_maps",
        f"{_DT}.debug._comm_mode.NATIVE_TO_PY_MAPPING",
        f"{_TD}.config._config",
    ),
    **_each(
        "the value depends on the key alone (a dtype, a device type, an action, an op schema's "
        "global shapes), nothing of the calling rank",
        f"{_TD}.checkpoint.filesystem._get_device_module",
        f"{_TD}._symmetric_memory._shmem_triton_utils.has_triton",
        f"{_TD}.fsdp._flat_param._get_dtype_size",
        f"{_TD}.pipelining.schedules._get_profiler_function_name",
        f"{_DT}._sharding_prop.ShardingPropagator._propagate_tensor_meta_cached",
        f"{_TD}._symmetric_memory._backend_streams",
        f"{_TD}._symmetric_memory._symm_mem_pools",
    ),
    **_each(
        "a warn-once memo: the process warns once, not each rank (a message, no value)",
        f"{_TD}.fsdp._flat_param._warn_skip_writeback_check",
        f"{_TD}.fsdp._flat_param._warn_use_fake_all_gather",
        f"{_TD}.fsdp._flat_param._warn_use_fake_reduce",
        f"{_TD}.fsdp._fully_shard._fsdp_init.warning_once",
    ),
    **_each(
        "logging and metrics handlers of the process (outputs, not values a rank reads back)",
        f"{_TD}.logging_handlers._log_handlers",
        f"{_TD}._shard.sharded_tensor.logging_handlers._log_handlers",
        f"{_TD}._sharded_tensor.logging_handlers._log_handlers",
        f"{_TD}.elastic.events._events_loggers",
        f"{_TD}.elastic.events.handlers._log_handlers",
        f"{_TD}.elastic.metrics.api._metrics_map",
        f"{_TD}.fsdp._debug_utils.SimpleProfiler.results",
    ),
    **_each(
        "a class-level default that instances shadow in __init__ (torch never fills the class's own)",
        f"{_TD}._shard.checkpoint.planner.SavePlanner._cached_all_plans",
        f"{_TD}._shard.checkpoint.planner.SavePlanner._cached_final_save_plan",
        f"{_TD}._shard.checkpoint.planner.SavePlanner._cached_global_plan",
        f"{_TD}._shard.checkpoint.planner.SavePlanner._cached_metadata",
        f"{_TD}._shard.checkpoint.planner.SavePlanner._cached_save_plan",
        f"{_TD}.checkpoint.planner.SavePlanner._cached_all_plans",
        f"{_TD}.checkpoint.planner.SavePlanner._cached_final_save_plan",
        f"{_TD}.checkpoint.planner.SavePlanner._cached_global_plan",
        f"{_TD}.checkpoint.planner.SavePlanner._cached_metadata",
        f"{_TD}.checkpoint.planner.SavePlanner._cached_save_plan",
        f"{_TD}.fsdp.wrap._ConfigAutoWrap.kwargs",
    ),
    **_each(
        "ShardedTensor's id -> tensor map: keys are ids of objects each rank creates, never equal "
        "across ranks while both are alive",
        f"{_TD}._shard.sharded_tensor.api._sharded_tensor_map",
        f"{_TD}._sharded_tensor.api._sharded_tensor_map",
    ),
    **_each(
        "RPC's bookkeeping (simdist does not run RPC: rpc.init_rpc needs its own agent)",
        f"{_TD}.rpc.api._all_gather_sequence_id",
        f"{_TD}.rpc.api._all_gather_sequence_id_to_states",
    ),
}


def fresh_cache(value: Any) -> Any:
    """An empty cache of the same kind: a rank's own, as a new process starts."""
    if isinstance(value, staticmethod):
        return staticmethod(fresh_cache(value.__func__))
    if isinstance(value, functools._lru_cache_wrapper):
        params = value.cache_parameters()
        # The wrapper type itself, then the decorated one's attributes
        # (``__wrapped__``, names, ``cache_parameters``): what ``lru_cache``
        # builds, in a third of its time (a rank's first turn makes one per cache).
        make: Any = functools._lru_cache_wrapper  # CPython's C type, or the pure-Python twin
        info: Any = functools._CacheInfo
        fresh: Any = make(value.__wrapped__, params["maxsize"], params["typed"], info)
        fresh.__dict__.update(value.__dict__)
        return fresh
    if isinstance(value, dict):
        return type(value)()
    raise TypeError(f"not a cache simdist knows how to renew: {type(value).__name__}")


def _namespace(owner: Any) -> Any:
    """Where a per-rank cache lives, as a live mapping: a module's dict or a
    class's mappingproxy (a class's raw entry: a staticmethod stays one)."""
    if not isinstance(owner, (type, types.ModuleType)):
        raise TypeError(f"a per-rank cache must live on a module or a class, not on {type(owner).__name__}")
    return vars(owner)


def slot_name(module_name: str) -> str:
    return f"torch caches of {module_name}"


# Each module's slot, made once (its places are found by walking attribute
# paths, ~10 us a module, at every run otherwise); the entry keeps the module
# object, so a module imported anew gets a slot of its own.
_made: dict[str, tuple[types.ModuleType, _Slot]] = {}


def module_slot(module: types.ModuleType) -> _Slot:
    """The per-rank caches of ``module`` as one slot (``rank_state`` swaps it).
    A cache the module does not have (another torch) is left out; the audit
    test is what notices."""
    made = _made.get(module.__name__)
    if made is not None and made[0] is module:
        return made[1]
    places = []  # (owner, its namespace, attribute, swapped in place)
    for name, path, _ in PER_RANK:
        if name == module.__name__:
            *owners, attr = path.split(".")
            try:
                owner = functools.reduce(getattr, owners, module)
                space = _namespace(owner)
                space[attr]
            except (AttributeError, KeyError):
                continue
            places.append((owner, space, attr, (name, path) in IN_PLACE))

    def get() -> tuple[Any, ...]:
        return tuple(dict(space[attr]) if in_place else space[attr] for _, space, attr, in_place in places)

    def set_(values: tuple[Any, ...]) -> None:
        for (owner, space, attr, in_place), value in zip(places, values):
            current = space[attr]
            if in_place:
                if current != value:
                    current.clear()
                    current.update(value)
            elif current is not value:
                setattr(owner, attr, value)

    # A rank's own value of a cache swapped in place is a snapshot of its
    # contents, which nothing mutates (``set_`` copies out of it): every
    # rank can start from one empty snapshot. When every cache of the
    # module is swapped in place, ranks that never touch them then share one
    # value, and a switch between them writes nothing.
    empty: dict[Any, Any] = {}
    all_in_place = bool(places) and all(place[3] for place in places)
    shared_fresh = tuple(empty for _ in places)

    def copy_(values: tuple[Any, ...]) -> tuple[Any, ...]:
        if all_in_place:
            return shared_fresh
        return tuple(empty if place[3] else fresh_cache(v) for place, v in zip(places, values))

    # Read at every switch: straight from each owner's namespace, without a call per place.
    rebound = [(space, attr) for _, space, attr, in_place in places if not in_place]
    in_place_ = [(space, attr) for _, space, attr, in_place in places if in_place]

    def fingerprint() -> Any:
        # Rebinding is the only change that needs a new read: a rank's cache
        # object itself is its value, whatever it holds. A dict swapped in
        # place is small (a counter per breakpoint): its items are read.
        return (
            tuple([id(space[attr]) for space, attr in rebound]),
            tuple([tuple(space[attr].items()) for space, attr in in_place_]),
        )

    slot = _Slot(slot_name(module.__name__), get, set_, copy_, fingerprint)
    _made[module.__name__] = (module, slot)
    return slot
