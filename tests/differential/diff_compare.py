"""Where two outcomes of one program differ, per rank, step and aspect.

Aspects: ``status`` (one world made the call, the other refused it or hung),
``values``/``buffers`` (what the call wrote, and the buffer around it),
``versions`` (autograd version counters), ``backward`` (gradients through
tensors saved before the call, or autograd's refusal), ``result_aliases``
(whether ``work.result()`` is the written tensors), ``objects``, ``forward``
and ``grad`` (differentiable collectives), ``returned`` (recv's return
value), and ``unclear_error`` (simdist refused with an error that does not
say what to change).

Values are compared bitwise wherever the result does not depend on the
order the backend combines contributions in: copies, integer and bool
reductions, MIN/MAX, small-integer data (exact in every dtype), and groups of
two (addition and multiplication commute). Float SUM/AVG/PRODUCT of normal
data over three or more ranks is compared within tolerance: gloo's order is
its own (see docs/differences.md). The same holds
for gradients of differentiable collectives whose backward is a sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from diff_program import Program
from diff_worlds import Outcome

ORDER_FREE_OPS = ("MIN", "MAX", "BAND", "BOR", "BXOR")
REDUCING = (
    "all_reduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "nn_all_reduce",
    "nn_reduce_scatter",
)
# Errors that come from simdist's own machinery rather than a decision to refuse.
UNCLEAR = ("AttributeError", "KeyError", "IndexError", "AssertionError", "UnboundLocalError", "NameError")


@dataclass(frozen=True)
class Difference:
    rank: int
    index: int
    op: str
    aspect: str
    gloo: str
    simdist: str
    # Members of the step's group that never reached it in either world: a hang
    # at an earlier step (both worlds agree on it) kept them away.
    absent: tuple[int, ...] = ()

    def __str__(self) -> str:
        return (
            f"rank {self.rank} step {self.index} ({self.op}) {self.aspect}: "
            f"gloo {self.gloo} | simdist {self.simdist}"
        )


def order_defined(program: Program, s: dict[str, Any]) -> bool:
    """True when every correct backend must give bitwise the same result."""
    if s["op"] not in REDUCING or s["red"] in ORDER_FREE_OPS:
        return True
    if s["values"] == "int" and not s["op"].startswith("nn_"):
        return True
    return len(program.members(s)) <= 2 and s["red"] != "AVG"


# Differentiable collectives whose backward sums the members' gradients
# (broadcast's is a reduce to the source, all_gather's a reduce-scatter,
# all_reduce's an all_reduce): float gradients then depend on the order.
SUMMED_IN_BACKWARD = ("nn_broadcast", "nn_all_gather", "nn_all_reduce")


def grad_order_defined(program: Program, s: dict[str, Any]) -> bool:
    """True when every correct backend must give bitwise the same gradient."""
    return s["op"] not in SUMMED_IN_BACKWARD or len(program.members(s)) <= 2


def compare(program: Program, gloo: Outcome, sim: Outcome) -> list[Difference]:
    found: list[Difference] = []
    # A gloo process that died took its world with it: later steps are not compared.
    crashed_at = min(
        (i for recs in gloo.ranks for i, r in recs.items() if r.get("type") == "crash"),
        default=len(program.steps),
    )
    absent = [_absent(program, s, index, gloo, sim) for index, s in enumerate(program.steps)]
    for rank in range(program.world):
        # A rank stuck in both worlds agrees on the hang; where it is stuck may
        # read differently (an async call is waited for later), and what it
        # never reached is not compared.
        both_hung = _hung(gloo.ranks[rank]) and _hung(sim.ranks[rank])
        for index, s in enumerate(program.steps):
            if index > crashed_at:
                break
            g, m = gloo.ranks[rank].get(index), sim.ranks[rank].get(index)
            if both_hung and (_unfinished(g) or _unfinished(m)):
                continue
            if crashed_at < len(program.steps) and (_lost_connection(g) or _unfinished_hang(g)):
                # A peer's process died: this rank's call saw its socket close,
                # or waits for it forever. What it would have done is unknown.
                break
            found.extend(_step(program, rank, index, s, g, m, absent[index]))
    return found


def _absent(program: Program, s: dict[str, Any], index: int, gloo: Outcome, sim: Outcome) -> tuple[int, ...]:
    return tuple(
        member
        for member in program.members(s)
        if all(_stuck_before(o.ranks[member], index) for o in (gloo, sim))
    )


def _stuck_before(records: dict[int, dict[str, Any]], index: int) -> bool:
    return any(i < index and r["status"] == "hang" for i, r in records.items())


def _lost_connection(record: dict[str, Any] | None) -> bool:
    if record is None or record["status"] != "error":
        return False
    text = record.get("error", "")
    return (
        "gloo/transport" in text or "Connection reset by peer" in text or "Connection closed by peer" in text
    )


def _unfinished_hang(record: dict[str, Any] | None) -> bool:
    return record is not None and record["status"] == "hang"


def _hung(records: dict[int, dict[str, Any]]) -> bool:
    return any(r["status"] == "hang" for r in records.values())


def _unfinished(record: dict[str, Any] | None) -> bool:
    return record is None or record["status"] == "hang"


def _status(record: dict[str, Any] | None) -> str:
    if record is None:
        return "not reached"
    if record["status"] in ("error", "hang"):
        return f"{record['status']} ({record.get('error', '')[:300]})"
    return record["status"]


def _step(
    program: Program,
    rank: int,
    index: int,
    s: dict[str, Any],
    g: dict[str, Any] | None,
    m: dict[str, Any] | None,
    absent: tuple[int, ...],
) -> list[Difference]:
    op = s["op"]
    if g is None and m is None:
        return []
    if (g is not None and g["status"] == "pending") or (m is not None and m["status"] == "pending"):
        # An async call one world never waited for (it died or hung at a later
        # step, where that difference is reported): its outcome is unknown.
        return []
    if g is None or m is None or g["status"] != m["status"]:
        return [Difference(rank, index, op, "status", _status(g), _status(m), absent)]
    if m["status"] == "error" and (m.get("type") in UNCLEAR or len(m.get("error", "")) < 25):
        return [Difference(rank, index, op, "unclear_error", _status(g), _status(m))]
    if m["status"] == "error" and g["status"] == "error" and g.get("type") != m.get("type"):
        # Both refused, for different reasons: not a difference in itself, but
        # the registry may know gloo's reason, and then what follows is its
        # consequence (diff_known.new_differences).
        return [Difference(rank, index, op, "both_refused", _status(g), _status(m))]
    if m["status"] != "ok":
        return []
    # None: bitwise; else the number of contributions whose order may differ.
    n = len(program.members(s))
    exact = None if order_defined(program, s) else n
    exact_grad = None if grad_order_defined(program, s) else n
    out = []
    for aspect in sorted(set(g) | set(m) - {"status"}):
        why = _differs(g.get(aspect), m.get(aspect), exact_grad if aspect == "grad" else exact)
        if why is not None:
            out.append(Difference(rank, index, op, aspect, why[0], why[1]))
    return out


def _differs(a: Any, b: Any, exact: int | None) -> tuple[str, str] | None:
    """(gloo's, simdist's) as text where they differ, else None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _tensor_differs(a, b, exact)
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return (f"keys {sorted(a)}", f"keys {sorted(b)}")
        for key in a:
            why = _differs(a[key], b[key], exact)
            if why is not None:
                return (f"{key}: {why[0]}", f"{key}: {why[1]}")
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return (f"{len(a)} items {a!r}"[:300], f"{len(b)} items {b!r}"[:300])
        for i, (x, y) in enumerate(zip(a, b)):
            why = _differs(x, y, exact)
            if why is not None:
                return (f"[{i}] {why[0]}", f"[{i}] {why[1]}")
        return None
    return None if a == b else (repr(a)[:300], repr(b)[:300])


def _tensor_differs(a: Any, b: Any, exact: int | None) -> tuple[str, str] | None:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return (repr(a)[:200], repr(b)[:200])
    if a.dtype != b.dtype or a.shape != b.shape:
        return (f"{a.dtype}{list(a.shape)}", f"{b.dtype}{list(b.shape)}")
    if _bitwise_equal(a, b):
        return None
    if exact is not None and (a.is_floating_point() or a.is_complex()):
        # Each of the n - 1 additions rounds once, in either order: the results
        # may differ by about n roundings of the largest partial sum (data are
        # normal, |x| of a few units), however small the result (cancellation).
        eps = torch.finfo(a.dtype).eps
        scale = max(1.0, float(a.abs().max()), float(b.abs().max()))
        if torch.allclose(
            b.double(), a.double(), rtol=2 * exact * eps, atol=4 * exact * eps * scale, equal_nan=True
        ):
            return None
    return (str(a.tolist())[:300], str(b.tolist())[:300])


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0:
        return True
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(_bytes(a), _bytes(b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    # A fresh dense copy: contiguous() keeps a one-element view's odd stride
    # (such a tensor already counts as contiguous), which view() refuses.
    return torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8)
