"""What a run returns or raises, decided from what happened (never from
which thread got somewhere first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import CollectiveMismatchError, DeadlockError, RankError, SimulationError, SimulationTimeout

if TYPE_CHECKING:
    from .world import World


def _fail(
    error: SimulationError,
    failures: dict[int, BaseException],
    results: list[Any],
    cause: BaseException | None = None,
) -> NoReturn:
    if not isinstance(error, RankError):
        error.failures = failures  # type: ignore[attr-defined]  # simdist's report on a plain exception
    error.results = results  # type: ignore[attr-defined]  # simdist's report on a plain exception
    raise error from cause


def outcome(
    world: World,
    results: list[Any],
    failures: dict[int, BaseException],
    timed_out: str | None,
    trace_error: BaseException | None = None,
) -> list[Any]:
    """In order: a deadlock, a collective mismatch (both even when every rank
    caught them), the watchdog, rank failures (the lowest failed rank is the
    cause), calls left incomplete. Every error carries ``results``: what each
    rank returned (None if it raised)."""
    found = world.scheduler.findings
    note = "" if trace_error is None else f"\n(the trace could not be written: {trace_error})"
    watchdog = "" if timed_out is None else f"\nafterwards the watchdog fired:\n{timed_out}"

    def tail() -> str:
        # Written only for an error: a run that succeeds (most of a test
        # suite's) never formats its flight records.
        recorded = world.recorder.tail(None if world.world_size <= 16 else sorted(failures))
        return recorded + world.call_site_notes() + note

    if found.deadlock is not None:
        _fail(DeadlockError(f"{found.deadlock}{watchdog}\n{tail()}"), failures, results, found.deadlock)
    mismatch = next((e for _, e in found.recorded if isinstance(e, CollectiveMismatchError)), None)
    if mismatch is not None:
        _fail(CollectiveMismatchError(f"{mismatch}{watchdog}\n{tail()}"), failures, results, mismatch)
    if timed_out is not None:
        _fail(SimulationTimeout(f"{timed_out}\n{tail()}"), failures, results)
    _raise_rank_failures(world, results, failures, tail)
    leftovers = world.scheduler.leftovers()
    if leftovers is not None:
        _fail(DeadlockError(f"every rank returned, but {leftovers}\n{tail()}"), failures, results)
    return results


def _raise_rank_failures(
    world: World, results: list[Any], failures: dict[int, BaseException], tail: Callable[[], str]
) -> None:
    """A ``RankError`` for the ranks that failed of their own accord or caught
    a simdist error and went on; peers released by a failure are listed."""
    found = world.scheduler.findings
    own = {r: e for r, e in failures.items() if r not in found.released}
    caught: dict[int, BaseException] = {}
    for r, e in found.recorded:  # simdist errors a rank caught and went on from
        if r not in failures and r not in caught:
            caught[r] = e
    if own or caught:
        lines = []
        for r in sorted({**own, **caught}):
            if r in own:
                lines.append(f"rank {r} ({world.describe_rank(r)}) failed: {type(own[r]).__name__}: {own[r]}")
            else:
                lines.append(
                    f"rank {r} ({world.describe_rank(r)}) caught {type(caught[r]).__name__} and "
                    f"went on (a failure all the same): {caught[r]}"
                )
        released = sorted(found.released)
        if released:
            lines.append(f"released from waits by the failure: rank(s) {released}")
        lines.append(tail())
        everything = {**caught, **own}
        _fail(
            RankError("\n".join(lines), everything, released), failures, results, everything[min(everything)]
        )
    if failures:  # only released ranks: cannot happen, but never return silently
        _fail(RankError(f"rank(s) {sorted(failures)} failed\n{tail()}", failures), failures, results)
