"""The text of deadlock reports: every rank's state, pending call and user stack."""

from __future__ import annotations

from collections.abc import Callable
from types import FrameType

from .. import stacks
from .frames import current_frames
from .matching import P2PTable
from .records import RankState
from .slots import Slots


def world_report_locked(
    headline: str, slots: Slots, p2p: P2PTable, describe_rank: Callable[[int], str]
) -> str:
    """``headline``, then each rank's line (and its helpers'), then the
    unmatched point-to-point operations."""
    frames = current_frames()
    lines = [headline]
    for rank, slot in enumerate(slots.ranks):
        where = describe_rank(rank)
        wait = wait_text(slots, rank)
        if wait is not None:
            lines.append(f"  rank {rank} ({where}): {wait}")
            frame = frames.get(slot.thread_id) if slot.thread_id is not None else None
            lines.extend("      " + s for s in stacks.user_stack(frame))
        else:
            lines.append(f"  rank {rank} ({where}): {slot.state.value}")
        lines.extend(helper_lines_locked(slots, rank, frames))
    unmatched = p2p.unmatched()
    if unmatched:
        lines.append("  unmatched point-to-point operations:")
        lines.extend(
            f"    rank {op.src if op.kind == 'send' else op.dst}: {op.describe()} at {op.site}"
            for op in unmatched
        )
    return "\n".join(lines)


def wait_text(slots: Slots, rank: int) -> str | None:
    """ "waiting in <call>; still missing rank(s) [...]" for a rank whose main
    thread waits in simdist, else None."""
    slot = slots.ranks[rank]
    if slot.state is not RankState.WAITING or slot.waiting_on is None:
        return None
    w = slot.waiting_on
    needed = list(w.needed_ranks())
    return f"waiting in {w.describe()}" + (f"; still missing rank(s) {needed}" if needed else "")


def helper_lines_locked(slots: Slots, rank: int, frames: dict[int, FrameType]) -> list[str]:
    """Each live helper thread of ``rank``: its state, and its user stack
    (where it is blocked, when that is outside simdist)."""
    lines = []
    for helper in slots.ranks[rank].helpers:
        hw = helper.waiting_on
        state = (
            "waiting in " + hw.describe()
            if hw is not None
            else "idle pool worker"
            if helper.idle
            else "running"
        )
        lines.append(f"    helper thread {helper.name!r}: {state}")
        if not helper.idle:
            frame = frames.get(helper.thread_id) if helper.thread_id is not None else None
            lines.extend("        " + s for s in stacks.user_stack(frame))
    return lines
