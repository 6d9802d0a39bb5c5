"""Matching calls between ranks: collectives by (group, sequence number),
point-to-point operations by (group, src, dst, tag) in posting order.

The tables also index who waits on whom, so the deadlock check after a rank
leaves looks only at calls that may need that rank (not at every waiting
rank, which would make a 4096-rank run quadratic). Every method is called
with the world's lock held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import SimulationError
from .records import Call, GroupInfo, P2POp, PendingCollective, RankState
from .slots import Slots

Channel = tuple[str, int, int, int]  # (group name, src, dst, tag)

ANY_SOURCE = -1  # the src of a recv that takes any sender, until it is matched


@dataclass(eq=False)
class AnySourceRecv(P2POp):
    """A recv without ``src``: any other member of the group may complete it.

    Its ``src`` is ``ANY_SOURCE`` until a send is matched, then that sender's
    global rank (what ``Work._source_rank`` reports, as a group rank).
    """

    needs_any = True  # any one of needed_ranks() can complete it (deadlock reads this)

    def needed_ranks(self) -> Sequence[int]:
        if self.done:
            return ()
        if self.src != ANY_SOURCE:
            return [self.src]
        return [r for r in self.group.ranks if r != self.dst]

    def describe(self) -> str:
        if self.src == ANY_SOURCE:
            return f"recv from any rank (tag {self.tag}) on {self.group.describe()}"
        return f"recv from any rank, matched rank {self.src} (tag {self.tag}) on {self.group.describe()}"


class CollectiveTable:
    def __init__(self) -> None:
        # The incomplete collectives of each group by sequence number, and
        # each rank's groups (with its index in them).
        self._open: dict[str, dict[int, PendingCollective]] = {}
        self._groups_of: dict[int, list[tuple[GroupInfo, int]]] = {}

    def join_locked(self, group: GroupInfo, seq: int, call: Call) -> tuple[PendingCollective, bool]:
        """Add ``call``; True when it was the last member's (the caller completes it)."""
        open_ = self._open.get(group.name)
        if open_ is None:  # the group's first call: index its members once
            open_ = self._open[group.name] = {}
            for i, member in enumerate(group.ranks):
                self._groups_of.setdefault(member, []).append((group, i))
        pending = open_.get(seq)
        if pending is None:
            pending = open_[seq] = PendingCollective(group, seq)
        if call.group_rank in pending.calls:
            raise SimulationError(f"internal: rank {call.rank} joined {pending.describe()} twice")
        pending.calls[call.group_rank] = call
        if len(pending.calls) < len(group.ranks):
            # A peer that has already left is noticed when this rank waits.
            return pending, False
        pending.completing = True
        del open_[seq]
        return pending, True

    def fail_group_locked(self, name: str, error: BaseException) -> list[PendingCollective]:
        """Take out every pending call on communicator ``name``, failed with ``error``."""
        open_ = self._open.get(name, {})
        failed = list(open_.values())
        open_.clear()
        for pending in failed:
            pending.error, pending.done = error, True
        return failed

    def waiters_on_locked(self, rank: int, slots: Slots) -> list[int]:
        """Waiting ranks in an open collective of ``rank``'s groups it has not joined."""
        ranks = slots.ranks
        out: list[int] = []
        for group, index in self._groups_of.get(rank, ()):
            for pending in self._open.get(group.name, {}).values():
                if index in pending.calls or pending.completing or pending.done:
                    continue
                for call in pending.calls.values():
                    s = ranks[call.rank]
                    if s.state is RankState.WAITING and s.waiting_on is pending:
                        out.append(call.rank)
        return out

    def leftovers(self) -> list[str]:
        """Each incomplete collective, group by group."""
        pending = [p for open_ in self._open.values() for p in open_.values()]
        return [f"  {p.describe()}: joined by group ranks {sorted(p.calls)}" for p in pending]


class P2PTable:
    def __init__(self) -> None:
        # Unmatched sends / recvs per channel, and the channels that wait on each rank.
        self.sends: dict[Channel, deque[P2POp]] = {}
        self.recvs: dict[Channel, deque[P2POp]] = {}
        self._on: dict[int, set[Channel]] = {}
        # Posting order of the queued ops, for a send that two recvs accept.
        self._posted: dict[P2POp, int] = {}
        self._count = 0

    def post_locked(self, op: P2POp) -> P2POp | None:
        """Queue ``op``, or take out and return the oldest opposite one it matches.

        A recv without ``src`` (``AnySourceRecv``) takes the oldest send of the
        lowest-ranked sender already queued to it; a send matches the recv
        posted first among its channel's and the any-source recvs of its tag.
        """
        if isinstance(op, AnySourceRecv):
            return self._post_any_locked(op)
        key = (op.group.name, op.src, op.dst, op.tag)
        mine, theirs = (self.sends, self.recvs) if op.kind == "send" else (self.recvs, self.sends)
        queue = theirs.get(key)
        if op.kind == "send":
            anyq = self.recvs.get((op.group.name, ANY_SOURCE, op.dst, op.tag))
            if anyq and (not queue or self._posted[anyq[0]] < self._posted[queue[0]]):
                queue = anyq
        if not queue:
            self._count += 1
            self._posted[op] = self._count
            mine.setdefault(key, deque()).append(op)
            self._on.setdefault(op.dst if op.kind == "send" else op.src, set()).add(key)
            return None
        other = queue.popleft()
        self._posted.pop(other, None)
        if isinstance(other, AnySourceRecv):
            other.src = op.src
        return other

    def _post_any_locked(self, op: AnySourceRecv) -> P2POp | None:
        name = op.group.name
        for src in sorted(op.group.ranks):
            queue = self.sends.get((name, src, op.dst, op.tag))
            if queue:
                op.src = src
                other = queue.popleft()
                self._posted.pop(other, None)
                return other
        key = (name, ANY_SOURCE, op.dst, op.tag)
        self._count += 1
        self._posted[op] = self._count
        self.recvs.setdefault(key, deque()).append(op)
        for peer in op.needed_ranks():
            self._on.setdefault(peer, set()).add(key)
        return None

    def fail_group_locked(self, name: str, error: BaseException) -> list[P2POp]:
        failed = []
        for table in (self.sends, self.recvs):
            for key in [k for k in table if k[0] == name]:
                for op in table.pop(key):
                    self._posted.pop(op, None)
                    op.error, op.done = error, True
                    failed.append(op)
        return failed

    def waiters_on_locked(self, rank: int, slots: Slots) -> list[int]:
        """Waiting ranks whose unmatched send or recv has ``rank`` as its peer."""
        ranks = slots.ranks
        out: list[int] = []
        for key in self._on.get(rank, ()):
            for table in (self.sends, self.recvs):
                for op in table.get(key, ()):
                    if rank in op.needed_ranks():
                        owner = op.owner
                        if ranks[owner].state is RankState.WAITING and ranks[owner].waiting_on is op:
                            out.append(owner)
        return out

    def leftovers(self, indent: str = "  ") -> list[str]:
        """Each unmatched send and recv (sends first), by the rank that posted it."""
        ops = [op for table in (self.sends, self.recvs) for q in table.values() for op in q]
        return [f"{indent}rank {op.owner}: {op.describe()} at {op.site}" for op in ops]
