"""``simdist.explore``: run a program under many schedules, find the one that differs.

With the run token, a program's outcome may depend only on its inputs, never
on which rank ran first, unless ranks race on state they still share (a
module global nobody made rank-local, an object passed with ``share_args``).
Running it under seeded random schedules and comparing each run with rank
order exposes such races exactly: a difference comes with the two schedules
that produce it, and each replays bitwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._checks import is_int
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


def _outcome(body: Callable[..., Any], run_kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
    records = _Records()
    with observe(records):
        try:
            results: Any = run(body, **run_kwargs)
        except Exception as exc:  # a failing program is an outcome too
            first = str(exc).splitlines()[0] if str(exc) else ""
            results = f"{type(exc).__name__}: {first}"
    return results, records.calls


def _first_difference(a: Any, b: Any, where: str = "results") -> str | None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            return f"{where}: tensors differ ({a.flatten()[:4].tolist()}... vs {b.flatten()[:4].tolist()}...)"
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and type(a) is type(b):
        if len(a) != len(b):
            return f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            found = _first_difference(x, y, f"{where}[{i}]")
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
    world_size, args, ...). A run that raises is compared by its error's type
    and first line.
    """
    if not is_int(schedules, 1):
        raise ValueError(f"schedules must be a positive int, got {schedules!r}")
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
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
