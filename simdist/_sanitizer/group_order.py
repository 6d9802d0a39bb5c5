"""NCCL's cross-communicator hazard: async calls on two groups issued in opposite orders.

Rank 0 issues an async call on group A, then one on B with A still in flight;
rank 1, a member of both, issues B's then A's. gloo completes both; on NCCL
each communicator's kernel waits on its own stream for every member, and the
two ranks' streams can each block on the call the other issued second: a
hang. Checked for every pair of groups when the run asks for it
(``check_group_order=True``), and always for two groups the program asked for
as NCCL (``new_group(backend="nccl")``, ``init_process_group("nccl")``; a
device map such as "cpu:gloo,cuda:nccl" only with the option).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from ..errors import AsyncRaceError
from .inflight import InFlight

Instance = tuple[str, int]  # (group name, sequence number)


class GroupOrder:
    """For each pair of call instances one rank had in flight together: who issued them in that order."""

    def __init__(self, every_group: bool) -> None:
        self._every_group = every_group
        self._lock = threading.Lock()
        self._before: dict[tuple[Instance, Instance], tuple[int, str, str]] = {}

    def issued(self, rank: int, new: InFlight, in_flight: Iterable[InFlight]) -> None:
        group = new.waitable.group
        mine: Instance = (group.name, new.waitable.seq)
        for old in in_flight:
            old_group = getattr(old.waitable, "group", None)
            seq = getattr(old.waitable, "seq", None)
            if old_group is None or seq is None or old_group.name == group.name:
                continue
            if not (self._every_group or (group.nccl and old_group.nccl)):
                continue
            theirs: Instance = (old_group.name, seq)
            with self._lock:
                other = self._before.get((mine, theirs))
                if other is not None and other[0] != rank:
                    raise AsyncRaceError(_message(rank, old, new, other))
                self._before.setdefault((theirs, mine), (rank, old.describe(), new.describe()))


def _message(rank: int, first: InFlight, second: InFlight, other: tuple[int, str, Any]) -> str:
    peer, peer_first, peer_second = other
    return (
        f"rank {rank} issued its {second.describe()} (at {second.site}) while its "
        f"{first.describe()} (at {first.site}) was in flight, but rank {peer} issued them in the "
        f"opposite order ({peer_first}, then {peer_second}): on NCCL two communicators' kernels "
        f"can each wait for the rank that issued the other first, a hang that gloo does not show. "
        f"Issue collectives on different groups in the same order on every rank, or wait for the "
        f"first before issuing the second."
    )
