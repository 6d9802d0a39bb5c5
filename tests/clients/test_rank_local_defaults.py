"""Process-wide state of torch and Megatron-core is rank-local by default.

Each case first shows the failure real code hits when the state is shared (the
default switched off), then that every rank is isolated with it, and that the
caller's values are back after the run.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

import simdist
import simdist._isolation.rank_local_defaults as defaults
from simdist import Layout

TIMEOUT = 60.0
LOG_SOFTMAX = torch.ops.aten._log_softmax.default


@pytest.fixture
def no_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(defaults, "default_slots", lambda taken: [])


def loss_parallel_body(ctx: simdist.RankContext) -> float:
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    logits = distribute_tensor(torch.arange(8.0).view(2, 4), mesh, [Shard(1)]).requires_grad_()
    with loss_parallel():
        loss = F.cross_entropy(logits, torch.tensor([1, 3]))
        loss.backward()
        dist.barrier()  # every rank is inside; then each leaves
    return loss.full_tensor().item()


def test_loss_parallel_shared_handler_table_fails_as_reported(no_defaults: None) -> None:
    with pytest.raises(simdist.RankError) as info:
        simdist.run(loss_parallel_body, world_size=2, timeout=TIMEOUT)
    assert isinstance(info.value.__cause__, KeyError) and "_log_softmax" in str(info.value.__cause__)


def test_loss_parallel_entered_by_every_rank_works_and_restores_the_caller() -> None:
    table = DTensor._op_dispatcher._custom_op_handlers
    before = dict(table)
    want = F.cross_entropy(torch.arange(8.0, dtype=torch.float64).view(2, 4), torch.tensor([1, 3])).item()
    assert simdist.run(loss_parallel_body, world_size=2, timeout=TIMEOUT) == pytest.approx([want] * 2)
    assert DTensor._op_dispatcher._custom_op_handlers is table and table == before


def peek_body(ctx: simdist.RankContext) -> list[bool]:
    seen = []
    if ctx.rank == 0:
        with loss_parallel():
            dist.barrier()
            seen.append(LOG_SOFTMAX in DTensor._op_dispatcher._custom_op_handlers)
            dist.barrier()
    else:
        dist.barrier()
        seen.append(LOG_SOFTMAX in DTensor._op_dispatcher._custom_op_handlers)  # rank 0 is inside now
        dist.barrier()
    return seen


@pytest.mark.parametrize("schedule", ["rank", "random"])
def test_one_ranks_loss_parallel_is_invisible_to_its_peers(schedule: str) -> None:
    assert simdist.run(peek_body, world_size=2, schedule=schedule, timeout=TIMEOUT) == [[True], [False]]


def test_without_the_default_a_peer_sees_the_handlers(no_defaults: None) -> None:
    assert simdist.run(peek_body, world_size=2, timeout=TIMEOUT) == [[True], [True]]


# --- module globals: the fingerprint must catch every kind of change ---------------------


def make_module() -> types.ModuleType:
    module = types.ModuleType("fingerprinted_state")
    exec("COUNT = 0\nITEMS = []\nGONE = 'here'\ndef helper():\n    return COUNT\n", module.__dict__)
    return module


def globals_body(ctx: simdist.RankContext, m: types.ModuleType) -> tuple:
    m.COUNT += ctx.rank + 1  # rebinding
    dist.barrier()
    m.ITEMS.append(ctx.rank)  # in place
    dist.barrier()
    setattr(m, f"NEW_{ctx.rank}", ctx.rank)  # a new name...
    dist.barrier()
    setattr(m, f"NEW_{ctx.rank}", -ctx.rank)  # ...rebound after it appeared
    if ctx.rank == 1:
        del m.GONE
    dist.barrier()
    names = sorted(k for k in vars(m) if k.startswith("NEW_"))
    return m.COUNT, list(m.ITEMS), names, getattr(m, f"NEW_{ctx.rank}"), hasattr(m, "GONE"), m.helper()


@pytest.mark.parametrize("schedule", ["rank", "random"])
def test_module_globals_rebound_mutated_added_and_deleted_stay_per_rank(schedule: str) -> None:
    m = make_module()
    sys.modules[m.__name__] = m
    try:
        got = simdist.run(
            globals_body,
            world_size=3,
            args=(m,),
            share_args=True,
            rank_local=[m],
            schedule=schedule,
            schedule_seed=5,
            timeout=TIMEOUT,
        )
    finally:
        del sys.modules[m.__name__]
    assert got == [(r + 1, [r], [f"NEW_{r}"], -r, r != 1, r + 1) for r in range(3)]
    assert (m.COUNT, m.ITEMS, m.GONE) == (0, [], "here")
    assert not [k for k in vars(m) if k.startswith("NEW_")]


# --- real backends named inside a rank ------------------------------------------------------


def gloo_group_body(ctx: simdist.RankContext) -> tuple[list[float], str]:
    group = dist.new_group([0, 1], backend="gloo")  # e.g. Megatron's gloo twin of each DP group
    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t, group=group)
    return t.tolist(), dist.get_backend(group)


def test_new_group_with_a_real_backend_name_is_simulated() -> None:
    helper = c10d._new_process_group_helper
    assert simdist.run(gloo_group_body, world_size=2, timeout=20.0) == [([3.0], "gloo")] * 2
    assert c10d._new_process_group_helper is helper, "put back after the run"


# --- Megatron-core -------------------------------------------------------------------------


def megatron_body(ctx: simdist.RankContext) -> list[int]:
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    return dist.get_process_group_ranks(ps.get_data_parallel_group())


def test_megatron_without_the_default_fails_as_reported(no_defaults: None) -> None:
    ps = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is not installed")
    before = dict(vars(ps))
    try:
        with pytest.raises(simdist.RankError, match="already initialized"):
            simdist.run(megatron_body, layout=Layout(tp=2, dp=2), timeout=TIMEOUT)
    finally:
        vars(ps).update(before)  # shared, rank 0's groups stayed in the caller's module


@pytest.mark.parametrize("explicit", [False, True])
def test_megatron_globals_are_per_rank_and_the_callers_come_back(explicit: bool) -> None:
    ps = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is not installed")
    layout = Layout(tp=2, dp=2)
    before = {k: v for k, v in vars(ps).items() if k.isupper()}
    got = simdist.run(
        megatron_body,
        layout=layout,
        timeout=TIMEOUT,
        rank_local=["megatron.core.parallel_state"] if explicit else (),
    )
    assert got == [layout.group_of("dp", r) for r in range(4)]
    assert all(vars(ps)[k] is v for k, v in before.items())
    assert not ps.model_parallel_is_initialized()


# --- a watched module first imported by a rank during the run ------------------------------


def late_import_body(ctx: simdist.RankContext, name: str) -> tuple[int, list[int]]:
    import importlib

    state = importlib.import_module(name)  # the first import in the process: rank 0's
    state.init(ctx.rank)  # refuses a second init, like Megatron
    dist.barrier()
    state.SEEN.append(ctx.rank)
    dist.barrier()
    return state.OWNER, list(state.SEEN)


def _write_init_once_module(folder, name: str, monkeypatch) -> None:
    """A module whose ``init`` refuses a second call, importable as ``name``."""
    (folder / f"{name}.py").write_text(
        "OWNER = None\nSEEN = []\n"
        "def init(rank):\n    global OWNER\n"
        "    if OWNER is not None:\n        raise RuntimeError('already initialized')\n"
        "    OWNER = rank\n"
    )
    monkeypatch.syspath_prepend(str(folder))


def test_a_watched_module_imported_inside_a_rank_is_still_per_rank(tmp_path, monkeypatch) -> None:
    name = "simdist_late_state_pkg"
    _write_init_once_module(tmp_path, name, monkeypatch)
    monkeypatch.setattr(defaults, "MEGATRON_MODULES", (name,))
    monkeypatch.delitem(sys.modules, name, raising=False)
    try:
        got = simdist.run(late_import_body, world_size=3, args=(name,), timeout=TIMEOUT)
        assert got == [(r, [r]) for r in range(3)]
        module = sys.modules[name]
        assert (module.OWNER, module.SEEN) == (None, []), "the caller gets the freshly imported globals"
        assert defaults._fresh_globals not in sys.meta_path, "the import hook is gone after the run"
        # Imported before the next run: the ordinary per-rank copy from run start.
        assert simdist.run(late_import_body, world_size=2, args=(name,), timeout=TIMEOUT) == [
            (0, [0]),
            (1, [1]),
        ]
    finally:
        sys.modules.pop(name, None)


def test_a_module_imported_inside_a_rank_without_the_hook_is_shared(tmp_path, monkeypatch) -> None:
    name = "simdist_late_state_unwatched"
    _write_init_once_module(tmp_path, name, monkeypatch)
    try:
        with pytest.raises(simdist.RankError, match="already initialized"):
            simdist.run(late_import_body, world_size=2, args=(name,), timeout=TIMEOUT)
    finally:
        sys.modules.pop(name, None)


def test_a_world_that_fails_to_build_removes_the_import_hook(tmp_path, monkeypatch) -> None:
    name = "simdist_late_state_never_run"
    _write_init_once_module(tmp_path, name, monkeypatch)
    monkeypatch.setattr(defaults, "MEGATRON_MODULES", (name,))
    monkeypatch.delitem(sys.modules, name, raising=False)

    def refuse(*args, **kwargs):
        raise MemoryError("no scheduler today")

    monkeypatch.setattr(simdist._run.world, "Scheduler", refuse)
    with pytest.raises(MemoryError, match="no scheduler today"):
        simdist.run(late_import_body, world_size=2, args=(name,), timeout=TIMEOUT)
    assert defaults._fresh_globals not in sys.meta_path
