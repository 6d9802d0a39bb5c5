"""What the World does on every call: flight record, faults, fingerprints.

Kept apart from the group registry (``world.py``) and thin, so these hooks can
move to the backend with the op semantics they serve. ``CallHooks`` is mixed
into ``World``, which provides ``recorder``, ``faults``, ``scheduler``,
``options`` and ``describe_rank``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backend import WorldHooks
from ..errors import CollectiveMismatchError, SimulationError
from ..faults import BackendError, Fault, InjectedFault, corrupt_contribution
from ..overlap import check_members_disjoint
from ..rendezvous import Call, GroupInfo, P2POp, PendingCollective, Waitable
from ..trace import Recorder, tensors_of

if TYPE_CHECKING:
    from ..faults import FaultState
    from ..rendezvous import Scheduler
    from .options import RunOptions


class CallHooks(WorldHooks):
    """The per-call half of ``backend.WorldHooks``."""

    recorder: Recorder
    faults: FaultState | None
    scheduler: Scheduler
    options: RunOptions

    def describe_rank(self, rank: int) -> str:
        raise NotImplementedError

    def before_call(self, call: Call, group: GroupInfo, seq: int) -> None:
        """Record the call and apply any fault due (runs on the calling rank).

        This rank's own faults act before it learns that the communicator was
        aborted elsewhere: what it reports must not depend on which thread got
        there first.
        """
        call.record = self.recorder.start(call.rank, seq, group, call.op, tensors_of(call.payload), call.site)
        if self.faults is None and not self.scheduler.any_group_aborted:
            return
        try:
            if self.faults is not None:
                for fault in self.faults.due(call.rank, call.op, group.describe(), seq):
                    where = f"{call.op} on {group.describe()} seq {seq} (rank {call.rank}, {self.describe_rank(call.rank)})"
                    self._apply(fault, where, group, call.op, call.payload, call, call.rank)
            self._raise_if_group_aborted(group)
        except BaseException as exc:
            Recorder.finish(call.record, failed=True)
            if isinstance(exc, SimulationError):  # an injected crash, a refused corruption
                self.scheduler.record(call.rank, exc)
            raise

    def before_p2p(self, op: P2POp) -> None:
        me = op.src if op.kind == "send" else op.dst
        op.record = self.recorder.start(me, -1, op.group, op.kind, [op.tensor], op.site)
        try:
            for fault in self.faults.due(me, op.kind, op.group.describe(), -1) if self.faults else ():
                where = f"{op.describe()} (rank {me}, {self.describe_rank(me)})"
                # The send's tensor is already simdist's own snapshot.
                payload = {"t": op.tensor} if op.kind == "send" else {}
                self._apply(fault, where, op.group, op.kind, payload, None, me)
            self._raise_if_group_aborted(op.group)
        except BaseException as exc:
            Recorder.finish(op.record, failed=True)
            if isinstance(exc, SimulationError):
                self.scheduler.record(me, exc)
            raise

    def _apply(
        self,
        fault: Fault,
        where: str,
        group: GroupInfo,
        op: str,
        payload: dict[str, Any],
        call: Call | None,
        rank: int,
    ) -> None:
        kind = fault.kind
        if kind == "crash":
            raise InjectedFault(f"injected crash at {where}")
        if kind == "delay":
            self.scheduler.sleep(fault.seconds)
        elif kind == "corrupt":
            corrupt_contribution(op, payload, fault.mode)
        elif kind == "timeout":
            error = BackendError(
                f"simdist: injected watchdog timeout: {where} never completed, so every "
                f"member of {group.describe()} fails (as NCCL's watchdog reports a timed-out collective)"
            )
            if call is None:
                raise error
            call.injected = error
        elif kind == "abort":
            error = BackendError(
                f"simdist: communicator {group.describe()} was aborted at {where}; every pending "
                f"and later call on it fails until the world is rebuilt"
            )
            # Members other than this rank fail because of it: a consequence.
            error.simdist_origin = rank  # type: ignore[attr-defined]
            self.scheduler.fail_group(group.name, error)
            raise BackendError(*error.args)

    def _raise_if_group_aborted(self, group: GroupInfo) -> None:
        # An early, unlocked check; the scheduler re-checks under its lock.
        error = self.scheduler.group_aborted(group.name)
        if error is not None:
            fresh = BackendError(*error.args)
            fresh.__dict__.update(error.__dict__)  # keeps who aborted it
            raise fresh

    def _on_done(self, waitable: Waitable) -> None:
        failed = waitable.error is not None
        if isinstance(waitable, PendingCollective):
            for call in waitable.calls.values():
                Recorder.finish(call.record, failed)
        else:
            Recorder.finish(getattr(waitable, "record", None), failed)

    def verify(self, group: GroupInfo, seq: int, calls: list[Call]) -> None:
        """The last member's check before the op completes (issue 18.3: with
        ``self.options.strict_call_sites`` differing ``call.site``s are a
        mismatch too; that comparison belongs here)."""
        for call in calls:
            if call.injected is not None:
                raise call.injected
        first = calls[0].fingerprint
        for c in calls:  # a plain loop: no generator on every collective
            if c.fingerprint != first:
                break
        else:
            check_members_disjoint(calls[0].op, group, seq, calls)
            return
        rows = []
        for c in calls:
            fp = dict(c.fingerprint)
            details = ", ".join(f"{k}={v}" for k, v in fp.items() if k != "op")
            rows.append(
                f"  rank {c.rank:<3} {self.describe_rank(c.rank):<24} {fp['op']:<24} "
                f"{details:<60} at {c.site}"
            )
        raise CollectiveMismatchError(
            f"collective mismatch on {group.describe()} at sequence number {seq}: "
            f"members called different collectives\n" + "\n".join(rows)
        )
