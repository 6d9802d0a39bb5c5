"""The sanitizer composes with tensor subclasses and dispatch modes: correct
code gives the same bits with it on and off, and a race made through a
subclass is caught at the user's line.

Subclasses with a dispatch of their own (DTensor, a user's wrapper) run with
the sanitizer's mode still on the stack, so the ops they run on the tensors
holding their values are checked; subclasses without one (``nn.Parameter``
subclasses, ``as_subclass`` types) are their own memory and are checked as
plain tensors; fake tensors hold no memory and go to their mode.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

import simdist
from simdist._sanitizer.mode import checked_ops
from simdist.errors import AsyncRaceError, RankError

WORLD = 4


# ----------------------------------------------------------------- programs


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(12, 16)
        self.w2 = nn.Linear(16, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.relu(self.w1(x)))


def _norm_then_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(12), _MLP()).double()


def _input() -> torch.Tensor:
    return torch.randn(2, 8, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def sequence_parallel(ctx: simdist.RankContext) -> dict[str, torch.Tensor]:
    """LayerNorm under SequenceParallel, then a column/row-parallel MLP: DTensor's
    backward runs its sharding propagation on fake tensors, with a
    reduce-scatter of the forward still in flight."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    plan = {
        "0": SequenceParallel(),
        "1.w1": ColwiseParallel(input_layouts=Shard(1)),
        "1.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    model = parallelize_module(_norm_then_mlp(), mesh, plan)
    out = model(distribute_tensor(_input(), mesh, [Shard(1)]))
    (out**2).sum().backward()
    return {name: p.grad.full_tensor() for name, p in model.named_parameters()}


def comm_debug_mode_over_dtensor(ctx: simdist.RankContext) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    x = distribute_tensor(_input(), mesh, [Shard(1)])
    with CommDebugMode() as counting:
        y = (x * 2).redistribute(mesh, [Shard(2)]).sum()
    return {"value": y.full_tensor(), "calls": counting.get_total_counts()}


def fake_tensors_with_a_call_in_flight(ctx: simdist.RankContext) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    t = torch.full((4,), float(ctx.rank))
    work = dist.all_reduce(t, async_op=True)
    with FakeTensorMode():
        shape = (torch.empty(3, 5) @ torch.empty(5, 2)).shape
    work.wait()
    return t * shape[0] * shape[1]


def functional_all_reduce(ctx: simdist.RankContext) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    t = torch.arange(6, dtype=torch.float64) + ctx.rank
    reduced = funcol.all_reduce(t, "sum", dist.group.WORLD)
    return (reduced * 3).sum(dim=0, keepdim=True)


PROGRAMS: dict[str, Callable[[simdist.RankContext], Any]] = {
    "dtensor-sequence-parallel": sequence_parallel,
    "comm-debug-mode-over-dtensor": comm_debug_mode_over_dtensor,
    "fake-tensor-mode": fake_tensors_with_a_call_in_flight,
    "functional-collective": functional_all_reduce,
}


def _bitwise(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.dtype == b.dtype
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _bitwise(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _bitwise(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_same_bits_with_the_sanitizer_on_and_off(name: str) -> None:
    program = PROGRAMS[name]
    off = simdist.run(program, world_size=WORLD, check_async=False)
    on = simdist.run(program, world_size=WORLD, check_async=True)
    _bitwise(on, off)


def test_sequence_parallel_matches_one_process() -> None:
    grads = simdist.run(sequence_parallel, world_size=WORLD, check_async=True)
    model = _norm_then_mlp()
    (model(_input()) ** 2).sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[0][name], p.grad, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------- planted races


class Wrapper(torch.Tensor):
    """A user's wrapper subclass: its values live in ``inner``."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapper:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[return-value]

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        def unwrap(x: Any) -> Any:
            return x.inner if isinstance(x, Wrapper) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
        return tree_map(lambda x: Wrapper(x) if isinstance(x, torch.Tensor) else x, out)


class ShardedParameter(nn.Parameter):
    """As sharding and quantisation libraries subclass Parameter."""


class Tagged(torch.Tensor):
    """A subclass made with ``as_subclass``: no dispatch of its own."""


def _dtensor_read(buffer_of: Callable[[Any], torch.Tensor]) -> Callable[[simdist.RankContext, bool], Any]:
    def body(ctx: simdist.RankContext, wait_first: bool) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, distribute_tensor

        mesh = init_device_mesh("cpu", (ctx.world_size,))
        x = distribute_tensor(torch.ones(4, 3), mesh, [Replicate()])
        work = dist.all_reduce(buffer_of(x), async_op=True)
        if wait_first:
            work.wait()
        out = (x * 2).to_local()  # the racing line when not waited
        work.wait()
        return out

    return body


def _through(make: Callable[[torch.Tensor], Any], memory: Callable[[Any], torch.Tensor]) -> Any:
    def body(ctx: simdist.RankContext, wait_first: bool) -> Any:
        value = make(torch.ones(4))
        work = dist.all_reduce(memory(value), async_op=True)
        if wait_first:
            work.wait()
        out = value * 2  # the racing line when not waited
        work.wait()
        return out

    return body


RACES = {
    "dtensor-local-tensor": _dtensor_read(lambda x: x._local_tensor),
    "user-wrapper-subclass": _through(Wrapper, lambda w: w.inner),
    "parameter-subclass-data": _through(lambda t: ShardedParameter(t), lambda p: p.data),
    "as-subclass": _through(lambda t: t.as_subclass(Tagged), lambda s: s),
}


def _values(t: torch.Tensor) -> torch.Tensor:
    return t.inner if isinstance(t, Wrapper) else t


RACING_LINES = [
    n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# the racing line" in text
]


@pytest.mark.parametrize("name", sorted(RACES))
def test_a_race_through_a_subclass_is_caught_at_the_users_line(name: str) -> None:
    body = RACES[name]
    before = checked_ops[0]
    with pytest.raises(RankError) as caught:
        simdist.run(body, world_size=2, args=(False,), check_async=True)
    failures = caught.value.failures
    assert set(failures) == {0, 1}
    for failure in failures.values():
        assert isinstance(failure, AsyncRaceError)
        assert any(f"test_subclasses.py:{line} " in str(failure) for line in RACING_LINES), str(failure)
    assert checked_ops[0] > before
    # The twin with the wait first runs clean, with the same values as without the sanitizer.
    on = simdist.run(body, world_size=2, args=(True,), check_async=True)
    off = simdist.run(body, world_size=2, args=(True,), check_async=False)
    for a, b in zip(on, off):
        assert torch.equal(_values(a), _values(b))


class _Forwarding(TorchDispatchMode):
    """A user's own mode that forwards every op (a profiler, a tracer)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _deepcopy_in_flight(ctx: simdist.RankContext) -> None:
    bucket = torch.ones(8)
    work = dist.all_reduce(bucket, async_op=True)
    copy.deepcopy(bucket)  # the racing line
    work.wait()


def _read_under_own_mode(ctx: simdist.RankContext) -> None:
    bucket = torch.ones(8)
    work = dist.all_reduce(bucket, async_op=True)
    with _Forwarding():
        bucket.sum()  # the racing line
    work.wait()


@pytest.mark.parametrize("body", [_deepcopy_in_flight, _read_under_own_mode], ids=["deepcopy", "own-mode"])
def test_the_racing_line_is_the_users_through_the_standard_library_and_a_users_mode(
    body: Callable[[simdist.RankContext], None],
) -> None:
    with pytest.raises(RankError) as caught:
        simdist.run(body, world_size=2, check_async=True)
    for failure in caught.value.failures.values():
        assert isinstance(failure, AsyncRaceError)
        assert any(f"test_subclasses.py:{line} " in str(failure) for line in RACING_LINES), str(failure)


def _metadata_of_a_buffer_in_flight(ctx: simdist.RankContext, read_values: bool) -> Any:
    bucket = torch.ones(8)
    work = dist.all_reduce(bucket, async_op=True)
    answers = (bucket.is_pinned(), bucket.dim(), bucket.is_same_size(bucket), bucket._version)
    if read_values:
        answers += (bucket.equal(bucket),)  # the racing line
    work.wait()
    return answers


def test_questions_answered_from_metadata_are_allowed_on_a_buffer_in_flight() -> None:
    on = simdist.run(_metadata_of_a_buffer_in_flight, world_size=2, args=(False,), check_async=True)
    assert on == simdist.run(_metadata_of_a_buffer_in_flight, world_size=2, args=(False,), check_async=False)
    with pytest.raises(RankError) as caught:
        simdist.run(_metadata_of_a_buffer_in_flight, world_size=2, args=(True,), check_async=True)
    assert all(isinstance(f, AsyncRaceError) for f in caught.value.failures.values())
