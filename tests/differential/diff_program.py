"""A differential program: plain data that both worlds (simdist and gloo) interpret.

A program is a world size, a seed for every rank's data, and a list of steps.
Each step is a small dict (JSON as it stands) naming one call and its form::

    {"op": "all_reduce", "group": [0, 2], "dtype": "float32", "shape": [3],
     "red": "SUM", "view": "strided", "async": true, "saved": true}

Keys every step may carry (defaults in ``DEFAULTS``):

- ``op``: one of ``OPS``; ``group``: sorted global ranks, or None for the
  default group (the whole world).
- ``dtype``, ``shape``, ``values`` ("int": small integers, exact in every
  dtype; "randn": normal floats, where summation order shows).
- ``red``: the reduce op name; ``root``: a group rank (broadcast, reduce,
  gather, scatter) or the sending group rank of ``send_recv``; ``peer``: the
  receiving group rank of ``send_recv``.
- ``view``: how the tensors the call writes are laid out in their buffers:
  "contig", "offset" (contiguous at a storage offset), "strided" (every other
  element of the last dimension), "transposed".
- ``inplace``: the in-place form (input is this rank's slot of the output).
- ``stack``: ``all_gather_into_tensor``/``reduce_scatter_tensor`` with the
  stacked ([n, *shape]) instead of concatenated output/input.
- ``uneven``: all_to_all/all_to_all_single with unequal per-pair sizes.
- ``async``: ``async_op=True`` and a deferred ``wait()``; ``group_arg``:
  pass peers/roots as group ranks (``group_src=``/``group_dst=``).
- ``saved``: the written tensors are saved for backward first (autograd
  then checks their version counters); ``skip``: the group's last member
  does not make the call (a hang on any backend).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
P2P = ("send_recv", "batch_ring")
OBJECT = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")
# torch.distributed.nn.functional: differentiable collectives (backward is a collective too).
DIFFERENTIABLE = (
    "nn_all_reduce",
    "nn_all_gather",
    "nn_broadcast",
    "nn_reduce_scatter",
    "nn_all_to_all_single",
)
OPS = COLLECTIVES + P2P + OBJECT + DIFFERENTIABLE

REDUCE_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")
DTYPES = (
    "float32",
    "float64",
    "bfloat16",
    "float16",
    "int8",
    "uint8",
    "int32",
    "int64",
    "bool",
    "complex64",
)
VIEWS = ("contig", "offset", "strided", "transposed")

DEFAULTS: dict[str, Any] = {
    "group": None,
    "dtype": "float32",
    "shape": [3],
    "values": "int",
    "red": "SUM",
    "root": 0,
    "peer": 1,
    "view": "contig",
    "inplace": False,
    "stack": False,
    "uneven": False,
    "async": False,
    "group_arg": False,
    "saved": False,
    "skip": False,
}


def step(op: str, **fields: Any) -> dict[str, Any]:
    """A step with every key filled in (unknown keys are refused)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    unknown = sorted(set(fields) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown step keys {unknown}; expected some of {sorted(DEFAULTS)}")
    return {"op": op, **DEFAULTS, **fields}


@dataclass(frozen=True)
class Program:
    world: int
    seed: int
    steps: tuple[dict[str, Any], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not 2 <= self.world <= 8:
            raise ValueError(f"world must be 2..8 ranks, got {self.world}")
        for i, s in enumerate(self.steps):
            group = s.get("group")
            if group is not None and (
                sorted(set(group)) != list(group) or not all(0 <= r < self.world for r in group)
            ):
                raise ValueError(f"step {i}: group {group} must be sorted distinct ranks below {self.world}")

    def members(self, s: Mapping[str, Any]) -> list[int]:
        return list(range(self.world)) if s["group"] is None else list(s["group"])

    def to_json(self) -> dict[str, Any]:
        # Only what differs from the defaults: shrunk cases stay readable.
        steps = [{k: v for k, v in s.items() if k == "op" or DEFAULTS.get(k) != v} for s in self.steps]
        return {"world": self.world, "seed": self.seed, "steps": steps}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Program:
        steps = tuple(step(**dict(s)) for s in data["steps"])
        return cls(world=int(data["world"]), seed=int(data["seed"]), steps=steps)

    def __str__(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)
