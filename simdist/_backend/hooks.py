"""What the world does at every call: record it, apply faults (and what a corrupt one damages), compare fingerprints.

``CallHooks`` is mixed into the World (which provides ``recorder``,
``faults``, ``scheduler``, ``describe_rank`` and ``strict_call_sites``): the
process group calls ``before_call``/``before_p2p`` on the calling rank and the
scheduler calls ``verify`` on the last member to arrive.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from .._core.records import Call, GroupInfo, P2POp
from .._core.scheduler import Scheduler
from ..debug import _hooks as debug_hooks
from ..errors import CollectiveMismatchError, SimulationError, UnsupportedOperationError, mark_consequence
from ..faults import BackendError, Fault, FaultState, InjectedFault
from ..trace import Recorder, tensors_of
from .ops import OPS, T

# How many meetings from different call sites a report lists.
_SITE_NOTES = 8


class CallHooks:
    recorder: Recorder
    faults: FaultState | None
    scheduler: Scheduler
    strict_call_sites: bool
    # Guards the call-site notes; shared by every world (it is taken rarely).
    _site_lock = threading.Lock()

    def describe_rank(self, rank: int) -> str:  # provided by the World
        raise NotImplementedError

    # -- per-call hooks -----------------------------------------------------

    def before_call(self, call: Call, group: GroupInfo, seq: int) -> None:
        """Record the call and apply any fault due (runs on the calling rank).

        This rank's own faults act before it learns that the communicator was
        aborted elsewhere: what it reports must not depend on which thread got
        there first.
        """
        debug_hooks.before_call(self, call.rank, call.op, group, seq)  # debug hook: pause door, break_at
        call.record = self.recorder.start(call.rank, seq, group, call.op, tensors_of(call.payload), call.site)
        if self.faults is None and not self.scheduler.any_group_aborted:
            return
        try:
            if self.faults is not None:
                for fault in self.faults.due(call.rank, call.op, group, seq):
                    where = f"{call.op} on {group.describe()} seq {seq} (rank {call.rank}, {self.describe_rank(call.rank)})"
                    self._apply(fault, where, group, call.op, call.payload, call, call.rank, seq)
            self._raise_if_group_aborted(group)
        except BaseException as exc:
            self._failed(call.record, call.rank, exc)
            raise

    def before_p2p(self, op: P2POp) -> None:
        me = op.src if op.kind == "send" else op.dst
        debug_hooks.before_call(self, me, op.kind, op.group, -1)  # debug hook: pause door, break_at
        op.record = self.recorder.start(me, -1, op.group, op.kind, [op.tensor], op.site)
        try:
            for fault in self.faults.due(me, op.kind, op.group, -1) if self.faults else ():
                where = f"{op.describe()} (rank {me}, {self.describe_rank(me)})"
                # The send's tensor is already simdist's own snapshot.
                payload = {T: op.tensor} if op.kind == "send" else {}
                self._apply(fault, where, op.group, op.kind, payload, None, me, -1)
            self._raise_if_group_aborted(op.group)
        except BaseException as exc:
            self._failed(op.record, me, exc)
            raise

    def _failed(self, record: Any, rank: int, exc: BaseException) -> None:
        Recorder.finish(record, failed=True)
        if isinstance(exc, SimulationError):  # an injected crash, a refused corruption
            self.scheduler.record(rank, exc)

    def _apply(
        self,
        fault: Fault,
        where: str,
        group: GroupInfo,
        op: str,
        payload: dict[str, Any],
        call: Call | None,
        rank: int,
        seq: int,
    ) -> None:
        kind = fault.kind
        if kind != "corrupt":
            self._fired(fault, rank, op, group, seq)
        if kind == "crash":
            raise InjectedFault(f"injected crash at {where}")
        if kind == "delay":
            self.scheduler.sleep(fault.seconds)
        elif kind == "corrupt":
            if call is not None and not contributes(op, call.group_rank, call.fingerprint):
                # Nothing of its own to damage: what it receives is, once received.
                def land(payload: dict[str, Any] = payload) -> None:
                    if corrupt_received(op, payload, fault.mode):
                        self._fired(fault, rank, op, group, seq)

                call.landing = land
            elif corrupt_contribution(op, payload, fault.mode):
                self._fired(fault, rank, op, group, seq)
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
            self.scheduler.fail_group(group.name, mark_consequence(error, rank))
            raise BackendError(*error.args)

    def _fired(self, fault: Fault, rank: int, op: str, group: GroupInfo, seq: int) -> None:
        if self.faults is not None:
            self.faults.fired_at(rank, fault, op, group, seq)

    def _raise_if_group_aborted(self, group: GroupInfo) -> None:
        # An early, unlocked check; the scheduler re-checks under its lock.
        error = self.scheduler.group_aborted(group.name)
        if error is not None:
            fresh = BackendError(*error.args)
            fresh.__dict__.update(error.__dict__)  # keeps who aborted it
            raise fresh

    # -- the last member's checks ------------------------------------------------------

    def verify(self, group: GroupInfo, seq: int, calls: list[Call]) -> None:
        for call in calls:
            if call.injected is not None:
                raise call.injected
        first = calls[0].fingerprint
        site = calls[0].site
        same_site = True
        for c in calls:  # a plain loop: no generator on every collective
            if c.fingerprint != first:
                break
            if c.site != site:
                same_site = False
        else:
            if not same_site:
                self._met_from_sites(group, seq, calls)
            return
        raise CollectiveMismatchError(
            f"collective mismatch on {group.describe()} at sequence number {seq}: "
            f"members called different collectives\n" + self._rows(calls)
        )

    def _rows(self, calls: list[Call]) -> str:
        rows = []
        for c in calls:
            fp = dict(c.fingerprint)
            details = ", ".join(f"{k}={v}" for k, v in fp.items() if k != "op")
            rows.append(
                f"  rank {c.rank:<3} {self.describe_rank(c.rank):<24} {fp['op']:<24} "
                f"{details:<60} at {c.site}"
            )
        return "\n".join(rows)

    def _met_from_sites(self, group: GroupInfo, seq: int, calls: list[Call]) -> None:
        """Members agree on the call but made it from different lines: legitimate
        in code that calls one collective from two places, and the signature of
        a rank that skipped a call and pairs its next one with its peers' last."""
        if self.strict_call_sites:
            raise CollectiveMismatchError(
                f"collective mismatch on {group.describe()} at sequence number {seq}: members "
                f"made the same call from different call sites (strict_call_sites=True; a rank "
                f"that skipped a collective pairs its next one with its peers' earlier one)\n"
                + self._rows(calls)
            )
        notes = self.__dict__.setdefault("_site_notes", [])  # setdefault: atomic, no __init__ needed
        with self._site_lock:
            if len(notes) < _SITE_NOTES:
                sites = ", ".join(f"rank {c.rank} at {c.site}" for c in calls)
                notes.append(f"  {calls[0].op} on {group.describe()} seq {seq}: {sites}")

    def call_site_notes(self) -> str:
        """For a failed run's report: where members met from different call sites."""
        notes = self.__dict__.get("_site_notes")
        if not notes:
            return ""
        return (
            "\nmembers met at one sequence number from different call sites (a rank that "
            "skipped a collective pairs its next one with its peers' earlier one; "
            "strict_call_sites=True makes this an error):\n" + "\n".join(notes)
        )


# -- what a corrupt fault damages (its keys come from the ops table) ----------------------
#
# A corrupt fault damages what its rank contributes to the call; on a rank that
# contributes nothing (a broadcast or scatter member other than the root) it
# damages what that rank receives, once the call has completed. Each function
# says whether it changed anything: a fault that changed nothing (an empty
# tensor, the sign of an integer 0) has not fired.

# Ops whose data flows from the root alone: the other members send nothing.
_FROM_ROOT = frozenset({"broadcast", "scatter"})
# A bit flip's view of a floating tensor.
_SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def contributes(op: str, group_rank: int, fingerprint: tuple[tuple[str, Any], ...]) -> bool:
    """Whether the member at ``group_rank`` sends data of its own in this call."""
    if op not in _FROM_ROOT:
        return True
    return dict(fingerprint).get("root") == group_rank


def corrupt_contribution(op: str, payload: dict[str, Any], mode: str) -> bool:
    """Damage what a rank contributes to a call, leaving the caller's input
    buffer intact unless the op overwrites it anyway."""
    spec = OPS[op]
    for key in spec.sent:
        if key not in payload:
            continue
        value = payload[key]
        tensors = list(value) if isinstance(value, (list, tuple)) else [value]
        if not spec.sent_is_output:
            tensors = [t.clone() for t in tensors]
            payload[key] = tensors if isinstance(value, (list, tuple)) else tensors[0]
        changed = [corrupt_(t, mode) for t in tensors]
        return any(changed)
    return False


def corrupt_received(op: str, payload: dict[str, Any], mode: str) -> bool:
    """Damage what a rank received from a completed call (its first output)."""
    spec = OPS[op]
    for key in sorted(spec.written | spec.updated):
        value = payload.get(key)
        if value is None:
            continue
        tensors = list(value) if isinstance(value, (list, tuple)) else [value]
        with torch.inference_mode(any(t.is_inference() for t in tensors)):
            changed = [corrupt_(t, mode) for t in tensors]
        return any(changed)
    return False


def corrupt_(t: torch.Tensor, mode: str) -> bool:
    """Damage the first element of ``t`` in place; False when that changed no bit."""
    if t.numel() == 0:
        return False
    # A one-element view of element [0, ..., 0] whatever the strides
    # (reshape would copy a non-contiguous tensor, and the damage would be lost).
    first = t.as_strided((1,), (1,))
    before = first.clone()
    if mode in ("nan", "inf"):
        if not t.dtype.is_floating_point:
            raise UnsupportedOperationError(f"corrupt mode {mode!r} needs a floating tensor, got {t.dtype}")
        first.fill_(float("nan") if mode == "nan" else float("inf"))
    elif t.dtype == torch.bool:  # sign and bitflip alike
        first.logical_not_()
    elif mode == "sign":
        first.neg_()
    elif t.dtype.is_floating_point:
        # bitflip: bit width-2 is the exponent's top bit: flipping it turns a
        # normal number into a huge or tiny one, like a real memory bit flip.
        first.view(_SAME_WIDTH_INT[t.dtype]).bitwise_xor_(1 << (torch.finfo(t.dtype).bits - 2))
    else:  # bitflip: the lowest bit for integers
        first.bitwise_xor_(1)
    if first.dtype.is_floating_point or first.dtype.is_complex:
        # Bit by bit: NaN never equals itself, and -0.0 equals 0.0.
        return bool(before.view(torch.uint8).ne(first.view(torch.uint8)).any())
    return bool(before.ne(first).any())
