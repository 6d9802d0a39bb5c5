"""Which waits can never complete, telling the threads that wait in them, and
the text of the reports (every rank's state, pending call and user stack).

Ranks wait for ranks (a collective for the members that have not joined, a
send for its receiver), and a waiting rank can complete only if every rank it
needs is running or can itself complete (``waitfor``). The waiting ranks
outside that set form a closed set nothing can ever wake: those blocked
(transitively) on a failed rank are released with ``PeerFailedError``, the
others are deadlocked and get ``DeadlockError``; ranks still running are left
alone. Which ranks are released therefore depends only on what each rank
waits for, never on thread timing.

A rank with helper threads is blocked only when its main thread and every
live helper wait, and can complete as soon as any one of its threads can; a
single thread waiting on a peer that has left is told alone. Every method is
called with the world's lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import FrameType

from .. import stacks
from ..errors import DeadlockError, PeerFailedError, mark_consequence
from .frames import current_frames
from .matching import CollectiveTable, P2PTable
from .records import PendingCollective, RankState, ThreadExit, Waitable, copy_error
from .slots import Aborts, Findings, HelperSlot, Slots
from .turns import Turns
from .waitfor import cannot_complete_threads, deadlock_core, deadlock_headline, failed_roots, reachable

Waits = dict[int, list[list[int]]]  # rank -> what each of its waiting threads needs
# rank -> (the wait its main thread makes with a timeout, the timeout in
# seconds, the error that wait raises when it times out)
Timed = dict[int, tuple[Waitable, float, Callable[[], BaseException]]]


class Detector:
    def __init__(
        self,
        slots: Slots,
        turns: Turns,
        collectives: CollectiveTable,
        p2p: P2PTable,
        aborts: Aborts,
        findings: Findings,
        describe_rank: Callable[[int], str],
    ) -> None:
        self._slots = slots
        self._turns = turns
        self._collectives = collectives
        self._p2p = p2p
        self._aborts = aborts
        self._findings = findings
        self._describe_rank = describe_rank
        self.timed: Timed = {}

    def report_locked(self, headline: str) -> str:
        return report_text_locked(self._slots, self._p2p, self._describe_rank, headline)

    # -- finding the stuck ranks ------------------------------------------------

    def settle_locked(self, trigger: int | None, defer: bool = False, left: int | None = None) -> bool:
        """Find the waiting ranks that can never complete; interrupt each.

        ``trigger`` is a rank that has just started waiting (only a closed set
        containing it can be new), or None after rank ``left`` left (only ranks
        that need it, directly or not, can be newly stuck). With ``defer``,
        a walk of the graph is not done now: returns True when it is needed
        (the caller runs it again shortly, if ``trigger`` still waits).
        """
        if self._aborts.error is not None:
            return False
        if trigger is not None:
            # The common case, O(1): every main thread that does not run waits
            # in this very collective, so each member that has not joined runs.
            slots = self._slots
            waitable = slots.ranks[trigger].waiting_on
            if (
                isinstance(waitable, PendingCollective)
                and slots.world_size - slots.running == waitable.waiters
            ):
                return False
        found = self._candidates_locked(trigger, defer, left)
        if found is None or isinstance(found, bool):
            return bool(found)
        waits, lone = found
        stuck = cannot_complete_threads(waits, self._slots.progressing)
        if lone:
            self._settle_threads_locked(lone, stuck)
        if stuck:
            # One list per rank: the ranks any of its threads needs (what reports show).
            graph = {r: sorted({p for needed in lists for p in needed}) for r, lists in waits.items()}
            if self.timed:
                stuck = self._time_out_locked(waits, stuck)
            if stuck:
                self._tell_stuck_locked(graph, stuck)
        return False

    # -- waits with a timeout -----------------------------------------------------

    def _time_out_locked(self, waits: Waits, stuck: set[int]) -> set[int]:
        """Time out the stuck waits that carry a timeout, shortest first, as the
        clock would; return the ranks deadlocked whatever those do next.

        A rank whose wait times out runs on, so the ranks that need it may yet
        complete: they keep waiting (and are looked at again once it waits or
        leaves). Ranks that cannot complete even so, and whose waits carry no
        timeout, are deadlocked; a timed wait among them times out next.
        """
        fired: set[int] = set()
        left = stuck
        while True:
            timed = self._timed_among_locked(left)
            if not timed:
                return left
            fired.update(self._fire_shortest_locked(timed))
            rest = {r: waits[r] for r in left if r not in fired}
            left = cannot_complete_threads(rest, lambda p: p in fired or self._slots.progressing(p))

    def _timed_among_locked(self, ranks: Iterable[int]) -> Timed:
        """The ranks of ``ranks`` whose main thread waits with a timeout."""
        slots = self._slots.ranks
        return {
            r: self.timed[r] for r in ranks if r in self.timed and slots[r].waiting_on is self.timed[r][0]
        }

    def _fire_shortest_locked(self, timed: Timed) -> set[int]:
        """Time out the waits of ``timed`` with the shortest timeout; return their ranks."""
        first = min(seconds for _, seconds, _ in timed.values())
        fired = set()
        for r, (waitable, seconds, make_error) in sorted(timed.items()):
            if seconds != first:
                continue
            fired.add(r)
            report = self.report_locked(
                f"rank {r} ({self._describe_rank(r)}) waits in {waitable.describe()} with a "
                f"timeout of {seconds:g} s, which can never complete (it needs rank(s) "
                f"{sorted(waitable.needed_ranks())}): its timeout error is raised without "
                f"waiting the timeout out (short timeouts are waited out first where that "
                f"is asked for, as simdist.torch_compat asks)"
            )
            error = make_error()
            error.__cause__ = DeadlockError(report)
            self._turns.interrupt_main_locked(r, error)
        return fired

    def _candidates_locked(
        self, trigger: int | None, defer: bool, left: int | None
    ) -> tuple[Waits, list[int]] | bool | None:
        """The waits to check and the ranks whose single threads to check
        (``lone``), or None when nothing can be stuck, or True when deferred."""
        slots = self._slots
        ranks = slots.ranks
        if trigger is not None:
            waitable = ranks[trigger].waiting_on
            assert waitable is not None  # the trigger has just started to wait
            # (The O(1) common case is settle_locked's.) Else O(group size): every rank it needs runs (or a helper of it does).
            needed = waitable.needed_ranks()
            if all(ranks[p].state is RankState.RUNNING or slots.progressing(p) for p in needed):
                return None
            # A peer that has left: certain at once, no walk needed to know it.
            if defer and not any(p in slots.gone for p in needed):
                return True
            return self._graph_from_locked(trigger), [trigger] if ranks[trigger].helpers else []
        if slots.waiting_count() == 0 and not slots.helper_waits:
            return None  # nobody waits
        if left is not None and not slots.helper_waits:
            # Only main threads wait: the ranks that need the one that left
            # are found through the indexes, not by scanning every rank.
            waits: Waits = {}
            for r in self._closure_on_locked(left):
                if r not in waits:
                    waits.update(self._graph_from_locked(r))
            return (waits, []) if waits else None
        waits = {
            r: thread_waits_locked(self._slots, r)
            for r, s in enumerate(ranks)
            if s.state is RankState.WAITING and not slots.progressing(r)
        }
        return waits, [r for r, s in enumerate(ranks) if s.helpers and r not in waits]

    def _closure_on_locked(self, rank: int) -> set[int]:
        """The waiting ranks that need ``rank``, directly or through other waiting ranks."""
        seen: set[int] = set()
        todo = [rank]
        while todo:
            r = todo.pop()
            # the waiting ranks whose call needs r
            for w in self._collectives.waiters_on_locked(r, self._slots) + self._p2p.waiters_on_locked(
                r, self._slots
            ):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    def _graph_from_locked(self, start: int) -> Waits:
        """The blocked ranks reachable from ``start`` through needed ranks,
        each with what every one of its threads needs."""
        slots = self._slots
        waits: Waits = {}
        todo = [start]
        while todo:
            r = todo.pop()
            if r in waits or slots.progressing(r):
                continue
            lists = thread_waits_locked(self._slots, r)
            waits[r] = lists
            todo += [p for needed in lists for p in needed if slots.ranks[p].state is RankState.WAITING]
        return waits

    # -- telling them -----------------------------------------------------------

    def _tell_stuck_locked(self, graph: dict[int, list[int]], stuck: set[int]) -> None:
        """Deadlock the core of ``stuck``; release the rest (from a failed rank, or the core)."""
        ranks = self._slots.ranks
        gone = self._slots.gone
        failed = {r: slot.root_failure for r, slot in enumerate(ranks) if slot.state is RankState.FAILED}
        roots = failed_roots(graph, stuck, failed)
        why = {r: f"which failed with {ranks[roots[r]].failure}" for r in stuck if roots[r] is not None}  # type: ignore[index]  # filtered to roots that are not None
        deadlocked = {r for r in stuck if roots[r] is None}
        # The core of a deadlock (ranks on a cycle, or waiting on a rank that
        # has finished) is the same whatever the timing; ranks that merely
        # wait on the core are released by it, as they would be had they
        # arrived after the core was reported.
        core = deadlock_core(graph, deadlocked, gone)
        for r in sorted(deadlocked - set(core)):
            roots[r] = next(c for c in reachable(graph, r, deadlocked) if c in core)
            why[r] = "which is deadlocked"
        if core:
            headline = deadlock_headline(graph, core, gone, all_wait=self._slots.running == 0)
            self._deadlock_locked(core, headline)
        for r in sorted(why):
            root = roots[r]
            assert root is not None
            released = PeerFailedError(
                f"released: rank {r} ({self._describe_rank(r)}) waits in "
                f"{ranks[r].waiting_on.describe()}, which needs rank {root} "  # type: ignore[union-attr]  # a released rank is waiting
                f"({self._describe_rank(root)}), {why[r]}"
            )
            self._turns.interrupt_rank_locked(r, mark_consequence(released, root))

    def _settle_threads_locked(self, lone: list[int], stuck: set[int]) -> None:
        """Ranks that still run (a helper or the main thread does) may have
        single threads that can never complete: waiting on a peer that has
        left or on a closed set of blocked ranks. Only those threads hear it."""
        slots = self._slots
        for r in lone:
            for helper, waitable in slots.waiting_threads(r):
                needed = [p for p in waitable.needed_ranks() if p != r]
                bad = sorted(p for p in needed if p in stuck or p in slots.gone)
                if bad and (len(bad) == len(needed) or not getattr(waitable, "needs_any", False)):
                    error = self._thread_error_locked(r, helper, waitable, bad)
                    if helper is None:
                        self._turns.interrupt_main_locked(r, error)
                    else:
                        slots.interrupt_helper_locked(helper, error)

    def _thread_error_locked(
        self, r: int, helper: HelperSlot | None, waitable: Waitable, bad: list[int]
    ) -> BaseException:
        ranks = self._slots.ranks
        failed = [p for p in bad if ranks[p].state is RankState.FAILED]
        who = "its main thread" if helper is None else f"its helper thread {helper.name!r}"
        if failed:
            root = ranks[failed[0]].root_failure
            root = failed[0] if root is None else root
            error = PeerFailedError(
                f"released: rank {r} ({self._describe_rank(r)}), {who}, waits in "
                f"{waitable.describe()}, which needs rank {root} "
                f"({self._describe_rank(root)}), which failed with {ranks[root].failure}"
            )
            return mark_consequence(error, root)
        deadlock = DeadlockError(
            self.report_locked(
                f"deadlock: rank {r}, {who}, waits in {waitable.describe()}, which needs "
                f"rank(s) {bad}: finished, or blocked for good"
            )
        )
        self._findings.deadlock_found_locked(deadlock)
        self._findings.record_locked(r, deadlock)
        return deadlock

    # -- scheduled liveness -----------------------------------------------------

    def nothing_runnable_locked(self) -> None:
        """Scheduled, a rank that waits while no rank can run waits forever,
        whatever it waits for (a store key, say, which the wait-for graph
        cannot attribute to a rank)."""
        slots = self._slots
        if slots.running > 0 or self._aborts.error is not None:
            return
        stuck = [r for r, s in enumerate(slots.ranks) if s.state is RankState.WAITING]
        if not stuck or any(slots.progressing(r) for r in stuck):
            return  # a helper thread still runs
        for r in stuck:
            w = slots.ranks[r].waiting_on
            if isinstance(w, ThreadExit) and not w.needed_ranks():
                return  # a Future is done, its callbacks are about to wake the waiter
        timed = self._timed_among_locked(stuck)
        if timed:
            # A timed wait ends, and its rank runs on: the others may yet wake.
            self._fire_shortest_locked(timed)
            return
        self._deadlock_locked(
            stuck,
            "deadlock: every live rank is waiting and none can run; rank(s) "
            f"{stuck} wait for something no rank will ever do",
        )

    def _deadlock_locked(self, ranks: list[int], headline: str) -> None:
        """Report a deadlock of ``ranks`` (``headline`` over the world's report) to each of them."""
        error = DeadlockError(self.report_locked(headline))
        self._findings.deadlock_found_locked(error)
        for r in ranks:
            self._findings.record_locked(r, error)
            self._turns.interrupt_rank_locked(r, copy_error(error))


def thread_waits_locked(slots: Slots, rank: int) -> list[list[int]]:
    """What each waiting thread of ``rank`` needs, its main thread first.

    A wait that any one of its ranks can end (a recv without ``src``:
    ``needs_any``) counts as one alternative per rank, as if each were a
    thread of its own: the rank can complete when any alternative can.
    """
    lists: list[list[int]] = []
    for _, waitable in slots.waiting_threads(rank):
        needed = list(waitable.needed_ranks())
        if getattr(waitable, "needs_any", False) and needed:
            lists += [[p] for p in needed]
        else:
            lists.append(needed)
    return lists


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


def report_text_locked(
    slots: Slots, p2p: P2PTable, describe_rank: Callable[[int], str], headline: str
) -> str:
    """``headline``, then each rank's line (and its helpers'): its state, or
    the call it waits in and its user stack; then the unmatched
    point-to-point operations."""
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
    unmatched = p2p.leftovers(indent="    ")
    if unmatched:
        lines.append("  unmatched point-to-point operations:")
        lines.extend(unmatched)
    return "\n".join(lines)
