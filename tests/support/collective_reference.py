"""Reference semantics of torch.distributed collectives, written in plain numpy.

Every function takes the inputs of one group's members, in group-rank order, and
returns what each member must hold afterwards. Nothing here uses threads,
torch.distributed or simdist: these are the definitions the simulated backend is
checked against, so they must stay independent of it.

Floating-point reductions are computed in float64 (the "true" value up to one
rounding per step); integer reductions in the input's own dtype, so unsigned
overflow wraps exactly as a C++ backend's does; bool reductions as logic.

Which (op, dtype) pairs exist follows what gloo on torch 2.13 accepts, measured on
this machine: BAND/BOR/BXOR only on integral dtypes (bool included), AVG only on
floating dtypes (gloo fails on integral AVG when it casts the float mean back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

REDUCE_OPS: tuple[str, ...] = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
BITWISE_OPS: tuple[str, ...] = ("BAND", "BOR", "BXOR")

# dtype kinds, named so that tests with torch dtypes and this numpy module agree.
FLOAT, INT, BOOL = "float", "int", "bool"


class UndefinedReduction(ValueError):
    """The (op, dtype kind) pair has no meaning in torch.distributed."""


def op_defined(op: str, kind: str) -> bool:
    """Whether torch (gloo) defines reduce ``op`` on dtypes of ``kind``."""
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduce op {op!r}; expected one of {REDUCE_OPS}")
    if kind == FLOAT:
        return op not in BITWISE_OPS
    if kind in (INT, BOOL):
        return op != "AVG"
    raise ValueError(f"unknown dtype kind {kind!r}; expected {FLOAT!r}, {INT!r} or {BOOL!r}")


def kind_of(array: np.ndarray) -> str:
    if array.dtype == np.bool_:
        return BOOL
    if np.issubdtype(array.dtype, np.integer):
        return INT
    if np.issubdtype(array.dtype, np.floating):
        return FLOAT
    raise ValueError(f"no reference semantics for numpy dtype {array.dtype}")


_FLOAT_STEPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "SUM": np.add,
    "AVG": np.add,  # divided by the member count afterwards
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
}
_INT_STEPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}
# On bool, torch's arithmetic is logic: a sum is "any", a product is "all".
_BOOL_STEPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "SUM": np.logical_or,
    "PRODUCT": np.logical_and,
    "MIN": np.logical_and,
    "MAX": np.logical_or,
    "BAND": np.logical_and,
    "BOR": np.logical_or,
    "BXOR": np.logical_xor,
}


def reduce_arrays(arrays: Sequence[np.ndarray], op: str) -> np.ndarray:
    """Reduce same-shaped arrays with ``op``.

    Floats come back as float64, integers in their own dtype (wrapping), bools as bool.
    """
    if not arrays:
        raise ValueError("reduce_arrays needs at least one array")
    shapes = {a.shape for a in arrays}
    dtypes = {a.dtype for a in arrays}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise ValueError(f"members disagree on shape/dtype: {shapes} / {dtypes}")
    kind = kind_of(arrays[0])
    if not op_defined(op, kind):
        raise UndefinedReduction(f"ReduceOp.{op} is not defined on {arrays[0].dtype}")
    if kind == FLOAT:
        step = _FLOAT_STEPS[op]
        acc = arrays[0].astype(np.float64)
        for a in arrays[1:]:
            acc = step(acc, a.astype(np.float64))
        return acc / len(arrays) if op == "AVG" else acc
    steps = _INT_STEPS if kind == INT else _BOOL_STEPS
    acc = arrays[0].copy()
    with np.errstate(over="ignore"):
        for a in arrays[1:]:
            acc = steps[op](acc, a).astype(arrays[0].dtype)
    return acc


# --- tensor collectives: per-member inputs in, per-member results out ------------


def all_reduce(inputs: Sequence[np.ndarray], op: str) -> list[np.ndarray]:
    result = reduce_arrays(inputs, op)
    return [result.copy() for _ in inputs]


def reduce(inputs: Sequence[np.ndarray], op: str, dst: int) -> np.ndarray:
    """What member ``dst`` holds; the others' buffers are unspecified (gloo scribbles)."""
    _check_member(dst, len(inputs), "dst")
    return reduce_arrays(inputs, op)


def broadcast(inputs: Sequence[np.ndarray], src: int) -> list[np.ndarray]:
    _check_member(src, len(inputs), "src")
    return [inputs[src].copy() for _ in inputs]


def all_gather(inputs: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
    return [[a.copy() for a in inputs] for _ in inputs]


def all_gather_into_tensor(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each member gets every member's input concatenated along dim 0, in rank order."""
    joined = np.concatenate(list(inputs), axis=0)
    return [joined.copy() for _ in inputs]


def reduce_scatter(input_lists: Sequence[Sequence[np.ndarray]], op: str) -> list[np.ndarray]:
    """Member r gets the reduction over members s of ``input_lists[s][r]``."""
    n = len(input_lists)
    for s, chunks in enumerate(input_lists):
        if len(chunks) != n:
            raise ValueError(f"member {s} gave {len(chunks)} chunks for a group of {n}")
    return [reduce_arrays([input_lists[s][r] for s in range(n)], op) for r in range(n)]


def reduce_scatter_tensor(inputs: Sequence[np.ndarray], op: str) -> list[np.ndarray]:
    """Each input is cut into len(inputs) equal chunks along dim 0; member r gets chunk r reduced."""
    n = len(inputs)
    return reduce_scatter([np.split(a, n, axis=0) for a in inputs], op)


def gather(inputs: Sequence[np.ndarray], dst: int) -> list[np.ndarray]:
    """What member ``dst`` receives (one array per member, in rank order)."""
    _check_member(dst, len(inputs), "dst")
    return [a.copy() for a in inputs]


def scatter(chunks: Sequence[np.ndarray], n: int) -> list[np.ndarray]:
    """Member r receives ``chunks[r]`` from the source's list."""
    if len(chunks) != n:
        raise ValueError(f"scatter list has {len(chunks)} entries for a group of {n}")
    return [c.copy() for c in chunks]


def all_to_all(input_lists: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    """Member r's output slot s is what member s put in its input slot r."""
    n = len(input_lists)
    return [[input_lists[s][r].copy() for s in range(n)] for r in range(n)]


def all_to_all_single(
    inputs: Sequence[np.ndarray], input_splits: Sequence[Sequence[int]] | None = None
) -> list[np.ndarray]:
    """Member s's input is cut along dim 0 by ``input_splits[s]`` (equal chunks when None);
    member r gets chunk r of every member, concatenated in member order."""
    n = len(inputs)
    pieces: list[list[np.ndarray]] = []
    for s, a in enumerate(inputs):
        if input_splits is None:
            if a.shape[0] % n:
                raise ValueError(f"member {s}: dim 0 of {a.shape} is not divisible by {n}")
            pieces.append(np.split(a, n, axis=0))
        else:
            splits = list(input_splits[s])
            if len(splits) != n or sum(splits) != a.shape[0]:
                raise ValueError(f"member {s}: splits {splits} do not cut {a.shape} into {n}")
            pieces.append(np.split(a, np.cumsum(splits)[:-1], axis=0))
    return [np.concatenate([pieces[s][r] for s in range(n)], axis=0) for r in range(n)]


def output_splits(input_splits: Sequence[Sequence[int]]) -> list[list[int]]:
    """The output split sizes each member must pass: member r receives input_splits[s][r] from s."""
    n = len(input_splits)
    return [[input_splits[s][r] for s in range(n)] for r in range(n)]


def ring_shift(inputs: Sequence[np.ndarray], step: int) -> list[np.ndarray]:
    """Point-to-point ring: member r receives what member (r - step) mod n sent."""
    n = len(inputs)
    return [inputs[(r - step) % n].copy() for r in range(n)]


# --- object collectives ---------------------------------------------------------


def broadcast_object_list(object_lists: Sequence[Sequence[Any]], src: int) -> list[list[Any]]:
    _check_member(src, len(object_lists), "src")
    return [list(object_lists[src]) for _ in object_lists]


def all_gather_object(objects: Sequence[Any]) -> list[list[Any]]:
    return [list(objects) for _ in objects]


def gather_object(objects: Sequence[Any], dst: int) -> list[Any]:
    _check_member(dst, len(objects), "dst")
    return list(objects)


def scatter_object_list(objects: Sequence[Any], n: int) -> list[Any]:
    if len(objects) != n:
        raise ValueError(f"scatter object list has {len(objects)} entries for a group of {n}")
    return list(objects)


# --- the layout the groups come from ---------------------------------------------
# Written from the other direction to simdist.layout: a C-order reshape of
# arange(world) to (pp, dp, cp, tp) makes tp the fastest axis, Megatron's order.

AXIS_ORDER: tuple[str, ...] = ("pp", "dp", "cp", "tp")  # slowest to fastest
GROUP_AXES: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "pp": ("pp",),
    "dp_cp": ("dp", "cp"),
    "mp": ("pp", "tp"),
    "world": ("pp", "dp", "cp", "tp"),
}


@dataclass(frozen=True)
class Sizes:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp


def megatron_rank(sizes: Sizes, tp: int, cp: int, dp: int, pp: int) -> int:
    return tp + sizes.tp * (cp + sizes.cp * (dp + sizes.dp * pp))


def reference_coords(sizes: Sizes, rank: int) -> tuple[int, int, int, int]:
    """(tp, cp, dp, pp) of ``rank``."""
    pp, dp, cp, tp = np.unravel_index(rank, (sizes.pp, sizes.dp, sizes.cp, sizes.tp))
    return int(tp), int(cp), int(dp), int(pp)


def reference_group_ranks(sizes: Sizes, axis: str) -> list[list[int]]:
    """Every group along ``axis``: each sorted, groups ordered by their first rank."""
    if axis not in GROUP_AXES:
        raise ValueError(f"unknown axis {axis!r}")
    grid = np.arange(sizes.world_size).reshape(sizes.pp, sizes.dp, sizes.cp, sizes.tp)
    varying = [AXIS_ORDER.index(a) for a in GROUP_AXES[axis]]
    fixed = [i for i in range(4) if i not in varying]
    members = np.transpose(grid, fixed + varying).reshape(-1, int(np.prod([grid.shape[i] for i in varying])))
    groups = [sorted(int(r) for r in row) for row in members]
    return sorted(groups, key=lambda g: g[0])


def reference_group_of(sizes: Sizes, axis: str, rank: int) -> list[int]:
    (group,) = [g for g in reference_group_ranks(sizes, axis) if rank in g]
    return group


def _check_member(index: int, n: int, what: str) -> None:
    if not 0 <= index < n:
        raise ValueError(f"{what} must be a member index in [0, {n}), got {index}")
