"""Abort/retry: rerun a failed step on a fresh world with the same layout and seed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._checks import is_int
from ._run import run
from .errors import SimulationError
from .faults import FaultPlan


@dataclass
class RetryOutcome:
    """The results of the attempt that succeeded, and the errors before it."""

    results: list[Any]
    attempts: int
    errors: list[SimulationError] = field(default_factory=list)


def run_with_retry(
    fn: Callable[..., Any],
    *,
    faults: FaultPlan | None = None,
    retries: int = 1,
    retry_faults: FaultPlan | None = None,
    **run_kwargs: Any,
) -> RetryOutcome:
    """Run ``fn`` with ``faults``; after a failure, rerun it on a fresh world.

    Retries use ``retry_faults`` (none by default), the same layout, seed and
    reduction model, and see their attempt number as ``ctx.attempt``. State the
    body keeps outside the world (a model, an optimizer, a step state) is
    deliberately shared between attempts: checking that a retry after an abort
    equals a clean run is the point. Raises the last error when every attempt
    failed.
    """
    if not is_int(retries, 0):
        raise ValueError(f"retries must be a non-negative int, got {retries!r}")
    errors: list[SimulationError] = []
    for attempt in range(retries + 1):
        plan = faults if attempt == 0 else retry_faults
        try:
            results = run(fn, faults=plan, attempt=attempt, **run_kwargs)
        except SimulationError as exc:
            errors.append(exc)
            if attempt == retries:
                raise
            continue
        return RetryOutcome(results=results, attempts=attempt + 1, errors=errors)
    raise AssertionError("unreachable")
