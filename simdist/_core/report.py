"""The text of deadlock reports: every rank's state, pending call and user stack."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .. import stacks
from .matching import P2PTable
from .records import RankState
from .slots import Slots


def world_report_locked(
    headline: str, slots: Slots, p2p: P2PTable, describe_rank: Callable[[int], str]
) -> str:
    """``headline``, then each rank's line (and its helpers'), then the
    unmatched point-to-point operations."""
    frames = sys._current_frames()
    lines = [headline]
    for rank, slot in enumerate(slots.ranks):
        where = describe_rank(rank)
        if slot.state is RankState.WAITING and slot.waiting_on is not None:
            w = slot.waiting_on
            needed = list(w.needed_ranks())
            lines.append(
                f"  rank {rank} ({where}): waiting in {w.describe()}"
                + (f"; still missing rank(s) {needed}" if needed else "")
            )
            frame = frames.get(slot.thread_id) if slot.thread_id is not None else None
            lines.extend("      " + s for s in stacks.user_stack(frame))
        else:
            lines.append(f"  rank {rank} ({where}): {slot.state.value}")
        for helper in slot.helpers:
            hw = helper.waiting_on
            lines.append(
                f"    helper thread {helper.name!r}: "
                + ("running" if hw is None else f"waiting in {hw.describe()}")
            )
            if hw is not None:
                frame = frames.get(helper.thread_id) if helper.thread_id is not None else None
                lines.extend("        " + s for s in stacks.user_stack(frame))
    unmatched = p2p.unmatched()
    if unmatched:
        lines.append("  unmatched point-to-point operations:")
        lines.extend(
            f"    rank {op.src if op.kind == 'send' else op.dst}: {op.describe()} at {op.site}"
            for op in unmatched
        )
    return "\n".join(lines)
