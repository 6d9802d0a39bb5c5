"""Reduction-order models: in which order the ranks' contributions are combined.

Every model is a pure function of its inputs (and, for ``shuffled``, of the seed
and the call's key), never of thread arrival order, so results are bitwise
reproducible. Partial results are kept in the tensor's own dtype at every step,
as NCCL rounds to the wire dtype at every hop; that is what makes low-precision
results depend on the order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

import torch

from ._checks import is_int
from .errors import UnsupportedOperationError

_INTEGER_ONLY = ("BAND", "BOR", "BXOR")


def op_name(op: object) -> str:
    """A ReduceOp (or its RedOpType) as a plain upper-case name, e.g. "SUM"."""
    red = getattr(op, "op", op)  # ReduceOp wraps a RedOpType
    name = getattr(red, "name", None) or str(red)
    return name.split(".")[-1].upper()


_checked: dict[tuple[object, torch.dtype], str] = {}


def check_reduce_op(op: object, dtype: torch.dtype, collective: str) -> str:
    """Validate ``op`` for ``dtype``; return its name. Raises a clear error."""
    key = (getattr(op, "op", op), dtype)
    try:
        return _checked[key]
    except (KeyError, TypeError):
        pass
    name = _check_reduce_op(op, dtype, collective)
    try:
        _checked[key] = name
    except TypeError:
        pass  # unhashable custom op objects are checked every time
    return name


def _check_reduce_op(op: object, dtype: torch.dtype, collective: str) -> str:
    name = op_name(op)
    if name not in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", *_INTEGER_ONLY):
        raise UnsupportedOperationError(
            f"{collective}: reduce op {name} is not supported by simdist "
            f"(supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)"
        )
    if dtype.is_complex and name not in ("SUM", "AVG"):
        # gloo and NCCL reduce complex tensors as their real views, which only
        # element-wise sums (and averages) can do.
        raise UnsupportedOperationError(
            f"{collective}: reduce op {name} is not supported on complex tensors (gloo and NCCL "
            f"reduce them as real views: SUM and AVG only), got {dtype}"
        )
    if name in _INTEGER_ONLY and dtype.is_floating_point:
        raise UnsupportedOperationError(
            f"{collective}: reduce op {name} needs an integer or bool tensor, got {dtype}"
        )
    if name == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
        raise UnsupportedOperationError(
            f"{collective}: reduce op AVG needs a floating-point tensor, got {dtype}"
        )
    return name


# Sum and product of booleans saturate: they are OR and AND.
_BOOL_COMBINE: dict[str, Callable[..., torch.Tensor]] = {
    "SUM": torch.logical_or,
    "MAX": torch.logical_or,
    "BOR": torch.logical_or,
    "PRODUCT": torch.logical_and,
    "MIN": torch.logical_and,
    "BAND": torch.logical_and,
    "BXOR": torch.logical_xor,
}
_COMBINE: dict[str, Callable[..., torch.Tensor]] = {
    "SUM": torch.add,
    "AVG": torch.add,
    "PRODUCT": torch.mul,
    "MIN": torch.minimum,
    "MAX": torch.maximum,
    "BAND": torch.bitwise_and,
    "BOR": torch.bitwise_or,
    "BXOR": torch.bitwise_xor,
}


def _combine_fn(name: str, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """Elementwise combine of two partial results (accepts ``out=``)."""
    return (_BOOL_COMBINE if dtype == torch.bool else _COMBINE)[name]


class ReductionModel:
    """Combines per-rank tensors (listed in group-rank order) into ``out``."""

    name = "base"

    def reduce_into(self, out: torch.Tensor, inputs: Sequence[torch.Tensor], op: str, key: str) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _finish_avg(out: torch.Tensor, op: str, n: int) -> None:
    if op == "AVG":
        out.div_(n)


def _by_chunks(
    out: torch.Tensor, inputs: Sequence[torch.Tensor], op: str, bounds: Sequence[int], first: int, step: int
) -> None:
    """Reduce the flattened inputs chunk by chunk (chunk c spans ``bounds[c]`` to
    ``bounds[c + 1]``), chunk c starting at rank ``(c + first) % n`` and taking
    the others hop by hop, ``step`` ranks at a time."""
    n = len(inputs)
    combine = _combine_fn(op, out.dtype)
    flats = [x.reshape(-1).to(out.device) for x in inputs]
    result = torch.empty_like(flats[0])
    for c in range(n):
        sl = slice(bounds[c], bounds[c + 1])
        if sl.start >= sl.stop:
            continue
        start = (c + first) % n
        acc = flats[start][sl].clone()
        for hop in range(1, n):
            acc = combine(acc, flats[(start + step * hop) % n][sl])
        result[sl] = acc
    out.copy_(result.view(out.shape))
    _finish_avg(out, op, n)


class RankOrder(ReductionModel):
    """((x0 + x1) + x2) + ...: the default, and the cheapest."""

    name = "rank"

    def reduce_into(self, out, inputs, op, key):
        combine = _combine_fn(op, out.dtype)
        first = inputs[0]
        # `out` may alias inputs[0] (in-place all_reduce on rank 0); every other
        # input is only read after out is written, and they never alias out.
        if out.data_ptr() != first.data_ptr():
            out.copy_(first)
        device = out.device
        for x in inputs[1:]:
            combine(out, x if x.device == device else x.to(device), out=out)
        _finish_avg(out, op, len(inputs))


class Ring(ReductionModel):
    """NCCL-like ring: the flattened tensor is cut into one chunk per rank and
    chunk c is reduced starting at rank (c + 1) % n, hop by hop around the ring."""

    name = "ring"

    def reduce_into(self, out, inputs, op, key):
        # The chunks torch.tensor_split makes: the first numel % n one element longer.
        n = len(inputs)
        size, longer = divmod(out.numel(), n)
        bounds = [c * size + min(c, longer) for c in range(n + 1)]
        _by_chunks(out, inputs, op, bounds, 1, 1)


class GlooRing(ReductionModel):
    """gloo's CPU all_reduce order (measured against torch 2.13's gloo): the
    flattened tensor is cut into chunks of ceil(numel / n) elements, and
    chunk c is summed from rank (c - 1) % n downwards, ((x[c-1] + x[c-2]) +
    ...) + x[c]. Bitwise gloo's all_reduce at 2 to 5 ranks (float16 and
    float32, 3 to 300,000 elements); at 6 to 8 ranks gloo cuts some chunks
    otherwise, and 1-2% of the elements round differently (near chunk edges)."""

    name = "gloo"

    def reduce_into(self, out, inputs, op, key):
        n, total = len(inputs), out.numel()
        chunk = -(-total // n)
        _by_chunks(out, inputs, op, [min(total, c * chunk) for c in range(n + 1)], -1, -1)


class Tree(ReductionModel):
    """Pairwise: (x0 + x1) + (x2 + x3), then pairs of pairs, and so on."""

    name = "tree"

    def reduce_into(self, out, inputs, op, key):
        combine = _combine_fn(op, out.dtype)
        level = [x.to(out.device) for x in inputs]
        while len(level) > 1:
            nxt = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        out.copy_(level[0])
        _finish_avg(out, op, len(inputs))


class Shuffled(ReductionModel):
    """Rank order permuted per call by a generator seeded from (seed, call key)."""

    name = "shuffled"

    def __init__(self, seed: int = 0) -> None:
        if not is_int(seed):
            raise TypeError(f"Shuffled(seed) needs an int seed, got {seed!r}")
        self.seed = seed

    def reduce_into(self, out, inputs, op, key):
        digest = hashlib.sha256(f"{self.seed}/{key}".encode()).digest()
        order = list(range(len(inputs)))
        random.Random(digest).shuffle(order)
        combine = _combine_fn(op, out.dtype)
        acc = inputs[order[0]].to(out.device).clone()
        for i in order[1:]:
            acc = combine(acc, inputs[i].to(out.device))
        out.copy_(acc)
        _finish_avg(out, op, len(inputs))

    def __repr__(self) -> str:
        return f"Shuffled(seed={self.seed})"


def make_model(spec: str | ReductionModel, seed: int = 0) -> ReductionModel:
    """``"rank"``, ``"ring"``, ``"tree"``, ``"gloo"``, ``"shuffled"`` (uses ``seed``), or a model."""
    if isinstance(spec, ReductionModel):
        return spec
    models: dict[str, type[ReductionModel]] = {
        "rank": RankOrder,
        "ring": Ring,
        "tree": Tree,
        "gloo": GlooRing,
    }
    if spec in models:
        return models[spec]()
    if spec == "shuffled":
        return Shuffled(seed)
    raise ValueError(
        f"reduction must be one of 'rank', 'ring', 'tree', 'gloo', 'shuffled' or a ReductionModel, got {spec!r}"
    )
