"""``simdist.explore``: run a program under many schedules, find the one that differs.

With the run token, a program's outcome may depend only on its inputs, never
on which rank ran first, unless ranks race on state they still share (a
module global nobody made rank-local, an object passed with ``share_args``).
Running it under seeded random schedules and comparing each run with rank
order exposes such races exactly: a difference comes with the two schedules
that produce it, and each replays bitwise.
"""

from __future__ import annotations

import dataclasses
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._checks import check_int
from ._run import RunObserver, observe, run

__all__ = ["Divergence", "explore"]


@dataclass(frozen=True)
class Divergence:
    """What ``explore`` found: the first random schedule whose outcome differs
    from rank order (``None`` fields when every schedule agreed)."""

    schedules: int  # random schedules run
    seed: int  # the run's seed (reduction model, ctx.seed), the same for both runs
    schedule_seed: int | None = None  # replays the differing run with schedule="random"
    what: str = ""  # the first difference, in words
    baseline: Any = None  # rank order's outcome: results, or "Type: message"
    outcome: Any = None  # the differing run's (the baseline's when none differs)

    @property
    def found(self) -> bool:
        return self.schedule_seed is not None

    def __str__(self) -> str:
        if not self.found:
            return f"no difference from rank order in {self.schedules} random schedule(s)"
        return (
            f"schedule='random', schedule_seed={self.schedule_seed} differs from "
            f"schedule='rank' (run seed={self.seed}): {self.what}"
        )


class _Records(RunObserver):
    """Keeps each run's calls per rank, in the order each rank made them."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def run_ended(self, world: Any) -> None:
        per_rank: dict[int, list[tuple[Any, ...]]] = {}
        for rec in world.recorder.all_records():
            per_rank.setdefault(rec.rank, []).append(
                (
                    rec.group.label,
                    rec.seq,
                    rec.op,
                    tuple(map(tuple, rec.shapes)),
                    tuple(map(str, rec.dtypes)),
                    rec.state,
                )
            )
        self.calls = [(r, tuple(per_rank[r])) for r in sorted(per_rank)]


class RunError(str):
    """A run that raised, as an outcome: shown as ``"Type: first line"``,
    compared by the error's type and the set of ranks that raised. The first
    line of a deadlock names whichever doomed rank was seen first, which may
    differ between schedules of the same deterministic deadlock."""

    type_name: str
    ranks: tuple[int, ...]

    def __new__(cls, exc: BaseException) -> RunError:
        first = str(exc).splitlines()[0] if str(exc) else ""
        self = super().__new__(cls, f"{type(exc).__name__}: {first}")
        self.type_name = type(exc).__name__
        self.ranks = _raising_ranks(exc)
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunError):
            return (self.type_name, self.ranks) == (other.type_name, other.ranks)
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


def _outcome(body: Callable[..., Any], run_kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
    records = _Records()
    with observe(records):
        try:
            results: Any = run(body, **run_kwargs)
        except Exception as exc:  # a failing program is an outcome too
            results = RunError(exc)
    return results, records.calls


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (a NaN equals a NaN with the same bits; -0.0 is not 0.0)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.layout != b.layout:
        return False
    if a.layout == torch.sparse_coo:
        # Canonical: coalesced, so the same tensor built in another order compares equal.
        x, y = a.detach().coalesce(), b.detach().coalesce()
        return _same_bits(x.indices(), y.indices()) and _same_bits(x.values(), y.values())
    if a.layout != torch.strided:  # CSR, CSC, BSR, BSC: compared by their values where they lie
        return _same_bits(a.detach().to_dense(), b.detach().to_dense())
    if a.is_quantized or b.is_quantized:
        return bool(torch.equal(a, b))
    x, y = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if x.numel() == 0:
        return True
    return bool(torch.equal(x.view(torch.uint8), y.view(torch.uint8)))


def _preview(t: torch.Tensor) -> list[Any]:
    dense = t.detach().to_dense() if t.layout != torch.strided else t.detach()
    return list(dense.flatten()[:4].tolist())


def _is_array(value: Any) -> bool:
    # numpy is looked up, never imported: a program that returns arrays has imported it.
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def _array_difference(a: Any, b: Any, where: str) -> str | None:
    if not (_is_array(a) and _is_array(b)):
        return f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{where}: array {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.hasobject:
        return _first_difference(a.ravel().tolist(), b.ravel().tolist(), where)
    if a.tobytes() != b.tobytes():  # bitwise, as tensors are
        return f"{where}: arrays differ ({a.ravel()[:4].tolist()}... vs {b.ravel()[:4].tolist()}...)"
    return None


def _raising_ranks(exc: BaseException) -> tuple[int, ...]:
    ranks = set(getattr(exc, "failures", None) or ()) | set(getattr(exc, "released", None) or ())
    return tuple(sorted(ranks))


def _first_difference(a: Any, b: Any, where: str = "results") -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if not _same_bits(a, b):
            return f"{where}: tensors differ ({_preview(a)}... vs {_preview(b)}...)"
        return None
    if isinstance(a, float) and isinstance(b, float):
        return None if struct.pack("<d", a) == struct.pack("<d", b) else f"{where}: {a!r} vs {b!r}"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    if _is_array(a) or _is_array(b):
        return _array_difference(a, b, where)
    if isinstance(a, BaseException) or isinstance(b, BaseException):
        if type(a) is not type(b):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        ranks_a, ranks_b = _raising_ranks(a), _raising_ranks(b)
        if ranks_a or ranks_b:  # a run's error: by its type and the ranks that raised (see RunError)
            return (
                None
                if ranks_a == ranks_b
                else f"{where}: {type(a).__name__} from ranks {ranks_a} vs {ranks_b}"
            )
        return _first_difference(list(a.args), list(b.args), f"{where}.args")
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        if type(a) is not type(b):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        for field in dataclasses.fields(a):
            found = _first_difference(getattr(a, field.name), getattr(b, field.name), f"{where}.{field.name}")
            if found:
                return found
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            found = _first_difference(a[k], b[k], f"{where}[{k!r}]")
            if found:
                return found
        return None
    try:
        same = bool(a == b)
    except Exception:
        same = a is b
    return None if same else f"{where}: {a!r} vs {b!r}"


def explore(
    body: Callable[..., Any], *, schedules: int = 20, seed: int = 0, run_seed: int = 0, **run_kwargs: Any
) -> Divergence:
    """Run ``body`` under rank order, then under ``schedules`` seeded random
    schedules (schedule seeds ``seed``, ``seed + 1``, ...); return the first
    whose per-rank results or per-rank flight record differ from rank order.

    ``run_seed`` is ``simdist.run``'s own ``seed`` (reduction model, ctx.seed),
    the same in every run; ``run_kwargs`` go to ``simdist.run`` too (layout,
    world_size, args, ...). Tensors (and floats) are compared bitwise, so a
    NaN equals a NaN with the same bits; a run that raises is compared by its
    error's type and the set of ranks that raised (shown as its first line).
    """
    check_int("schedules", schedules, minimum=1)
    check_int("seed", seed, show_type=True)
    for refused in ("schedule", "schedule_seed", "seed"):
        if refused in run_kwargs:
            raise TypeError(f"explore() sets run's {refused} itself (pass run_seed= for run's seed)")
    base, base_calls = _outcome(body, dict(run_kwargs, schedule="rank", seed=run_seed))
    for i in range(schedules):
        s = seed + i
        got, calls = _outcome(body, dict(run_kwargs, schedule="random", schedule_seed=s, seed=run_seed))
        what = _first_difference(base, got)
        if what is None and calls != base_calls:
            rank = next((a[0] for a, b in zip(base_calls, calls) if a != b), None)
            what = f"the flight record of rank {rank} differs (calls made, or their order or outcome)"
        if what is not None:
            return Divergence(
                schedules=i + 1, seed=run_seed, schedule_seed=s, what=what, baseline=base, outcome=got
            )
    return Divergence(schedules=schedules, seed=run_seed, baseline=base, outcome=base)
