"""Timeouts as gloo reports them, delivered once a wait can never complete.

simdist keeps no clock: a wait that carries a timeout fails exactly when
deadlock detection knows it can never complete, with the error gloo raises in
that rank (type and words measured on torch 2.13), the deadlock report as its
``__cause__``; a wait that completes, however late, never times out. When the
error is raised (at once, or after waiting out a short timeout under
``simdist.torch_compat``): docs/backend-compat.md, "Timeouts".
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from .._core.records import P2POp, Waitable
from .._core.scheduler import Scheduler
from ..errors import mark_consequence

# What torch_compat waits out (PyTorch's tests use timeouts of 1-5 s).
REAL_TIME_UP_TO_S = 5.0
# Timeouts up to this many seconds are waited out before their error is
# raised; 0: every one is raised at once (the default outside torch_compat).
waited_out_up_to_s = 0.0


def seconds_of(timeout: Any) -> float | None:
    """A timeout argument in seconds; None where it is unset (None, zero or
    negative: c10d's "no timeout" and "unset" values)."""
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return seconds if seconds > 0 else None


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def transport_timeout(seconds: float, kind: str = "recv") -> RuntimeError:
    """What gloo's transport raises when a wait on a peer times out."""
    when = "waited out" if seconds <= waited_out_up_to_s else "reported at once"
    return RuntimeError(
        f"Timed out waiting {ms(seconds)}ms for {kind} operation to complete "
        f"(simdist: it can never complete, so the timeout is {when})"
    )


def wait_timed(
    scheduler: Scheduler,
    rank: int,
    waitable: Waitable,
    seconds: float,
    error: BaseException,
    started: float | None = None,
) -> None:
    """Wait; should the wait never complete, raise ``error`` (its cause: the
    deadlock report), no earlier than ``seconds`` after ``started`` (a
    ``time.monotonic()``; by default now) where the timeout is short."""
    if started is None:
        started = time.monotonic()
    try:
        scheduler.wait_timed(rank, waitable, seconds, lambda: error)
    except BaseException as exc:
        if exc is error and seconds <= waited_out_up_to_s:
            left = started + seconds - time.monotonic()
            if left > 0:
                scheduler.sleep(left)
        raise


def close_group(scheduler: Scheduler, rank: int, waitable: Waitable, what: str) -> None:
    """gloo closes a timed-out rank's connections: every pending and later
    call on the group fails, in every member (a consequence of ``rank``)."""
    group = getattr(waitable, "group", None)
    if group is None:
        return
    error = RuntimeError(
        f"Application timeout caused pair closure (simdist: rank {rank} timed out in {what}; "
        f"gloo closes the connections of a timed-out wait, so {group.describe()} is closed)"
    )
    scheduler.fail_group(group.name, mark_consequence(error, rank))


def wait_with_timeout(
    scheduler: Scheduler,
    rank: int,
    waitable: Waitable,
    seconds: float,
    explicit_wait: bool,
    issued: float | None = None,
) -> None:
    """A Work's wait that carries a timeout, failing as gloo's would: an
    explicit ``Work.wait(timeout)`` on a collective raises "Operation timed
    out!"; a transport timeout (a group's or a barrier's timeout, or any timed
    point-to-point wait) raises "Timed out waiting ...ms for recv operation to
    complete". Either closes the group: the call never completes anywhere.
    gloo's transport clock starts at the call's ``issued`` time; an explicit
    wait's at the wait."""
    p2p = isinstance(waitable, P2POp)
    what = waitable.describe()
    if explicit_wait and not p2p:
        error = RuntimeError("Operation timed out!")
    else:
        error = transport_timeout(seconds, waitable.kind if p2p else "recv")  # type: ignore[attr-defined]  # a P2POp has its kind
    try:
        wait_timed(scheduler, rank, waitable, seconds, error, None if explicit_wait else issued)
    except RuntimeError as exc:
        if exc is error:
            close_group(scheduler, rank, waitable, what)
        raise
