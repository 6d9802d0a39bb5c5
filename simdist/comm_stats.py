"""Communication accounting: calls and bytes per rank, per group, per op.

In the spirit of DTensor's ``CommDebugMode``, but at the process-group level,
so it sees every collective and point-to-point call the code under test makes::

    with simdist.CommStats() as stats:
        simdist.run(body, layout=layout)
    print(stats.table())
    stats.assert_at_most({"dp:all_reduce": 1, "tp": 4})

Every ``simdist.run`` started in the ``with`` block (in the same thread) is
counted; several runs add up. The counts come from the flight recorder's
records, so "bytes" is what the recorder shows per call: the sum of the sizes of
every tensor the rank passed to the call (inputs and outputs, e.g. both the
input and the gathered list of an ``all_gather``).

Groups are named by their axis label as reports name them: ``tp``, ``dp/dp_cp``
(axes with the same members share one communicator), ``world``, or ``group N``
for groups made with ``dist.new_group``. A selector ``"dp"`` matches every label
that has ``dp`` among its ``/``-separated parts.
"""

from __future__ import annotations

import contextvars
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ._checks import is_int

__all__ = ["CommCount", "CommStats"]

# A tuple of the CommStats active in this thread (nested blocks all count).
# A ContextVar, not a global: two threads running worlds at once, or two
# pytest-xdist workers, never see each other's blocks.
_ACTIVE: contextvars.ContextVar[tuple[CommStats, ...]] = contextvars.ContextVar(
    "simdist_comm_stats", default=()
)


@dataclass(frozen=True)
class CommCount:
    """Number of calls and bytes moved by a selection of calls."""

    calls: int = 0
    bytes: int = 0

    def __add__(self, other: CommCount) -> CommCount:
        return CommCount(self.calls + other.calls, self.bytes + other.bytes)


Key = tuple[int, str, str]  # (rank, group label, op)
_FullKey = tuple[int, str, str, str]  # ... and the caller's file


class CommStats:
    """Counts the calls of every ``simdist.run`` made inside ``with CommStats():``."""

    def __init__(self) -> None:
        self._counts: dict[_FullKey, CommCount] = defaultdict(CommCount)
        # label -> the axes the group answers to (read from the group, not the label text)
        self._axes: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()
        self._token: contextvars.Token[tuple[CommStats, ...]] | None = None
        self.runs = 0

    def __enter__(self) -> CommStats:
        if self._token is not None:
            raise RuntimeError("this CommStats is already active; use a new CommStats() per with-block")
        self._token = _ACTIVE.set(_ACTIVE.get() + (self,))
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._token is not None
        _ACTIVE.reset(self._token)
        self._token = None

    # ---------------------------------------------------------------- input

    def add_records(self, records: Iterable[Any]) -> None:
        """Adds flight-recorder records (one run's); called by ``simdist.run``."""
        with self._lock:
            for rec in records:
                # The file, not file:line: a budget names code, not a line of it.
                group = rec.group
                key = (rec.rank, group.label, rec.op, rec.site.rpartition(":")[0])
                self._axes[group.label] = getattr(group, "axes", ())
                self._counts[key] = self._counts[key] + CommCount(1, rec.nbytes)
            self.runs += 1

    # -------------------------------------------------------------- queries

    def summary(self, *, rank: int | None = None) -> dict[Key, CommCount]:
        """``{(rank, group, op): CommCount}``, sorted; only ``rank``'s when given."""
        out: dict[Key, CommCount] = defaultdict(CommCount)
        for (r, g, o, _), count in self._counts.items():
            if rank is None or r == rank:
                out[r, g, o] = out[r, g, o] + count
        return dict(sorted(out.items()))

    def per_rank(
        self, *, group: str | None = None, op: str | None = None, site: str | None = None
    ) -> dict[int, CommCount]:
        """Calls and bytes of each rank that made a matching call.

        ``site`` keeps only calls made from a file whose path ends with it
        (``"_validation.py"``): the budget of one piece of code.
        """
        out: dict[int, CommCount] = defaultdict(CommCount)
        for (r, g, o, f), count in self._counts.items():
            if self._matches(g, o, group, op) and (site is None or f.endswith(site)):
                out[r] = out[r] + count
        return dict(sorted(out.items()))

    def count(
        self,
        *,
        rank: int | None = None,
        group: str | None = None,
        op: str | None = None,
        site: str | None = None,
    ) -> CommCount:
        """Calls and bytes of the matching calls, summed over ranks unless ``rank`` is given."""
        total = CommCount()
        for r, count in self.per_rank(group=group, op=op, site=site).items():
            if rank is None or r == rank:
                total = total + count
        return total

    def _matches(self, label: str, op: str, group: str | None, want_op: str | None) -> bool:
        if want_op is not None and op != want_op:
            return False
        return group is None or group == label or group in self._axes.get(label, ())

    def table(self) -> str:
        """The counts as a text table, one row per (rank, group, op)."""
        rows = [("rank", "group", "op", "calls", "bytes")]
        rows += [(str(r), g, o, str(c.calls), str(c.bytes)) for (r, g, o), c in self.summary().items()]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = [
            "  ".join(
                cell.rjust(w) if i in (0, 3, 4) else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(row, widths))
            )
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(line.rstrip() for line in lines)

    __str__ = table

    # ----------------------------------------------------------- assertions

    def assert_at_most(
        self, calls: Mapping[str, int] | None = None, *, bytes: Mapping[str, int] | None = None
    ) -> None:
        """Every rank stays within a budget, or ``AssertionError`` says which exceeded it.

        Keys select calls: ``"dp"`` (a group), ``"dp:all_reduce"`` (a group's
        op), ``"*:send"`` (an op on any group), ``"*"`` (everything). Values are
        per-rank limits on the number of calls (``calls``) or bytes (``bytes``).
        """
        if calls is None and bytes is None:
            raise ValueError("assert_at_most needs a calls budget, a bytes budget, or both")
        problems: list[str] = []
        for what, budget in (("calls", calls), ("bytes", bytes)):
            for key, limit in (budget or {}).items():
                if not is_int(limit, 0):
                    raise ValueError(
                        f"assert_at_most: the {what} limit for {key!r} must be an int >= 0, got {limit!r}"
                    )
                group, op = _parse_key(key)
                for r, count in self.per_rank(group=group, op=op).items():
                    value = getattr(count, what)
                    if value > limit:
                        problems.append(f"rank {r}: {value} {what} on {key!r}, budget {limit}")
        if problems:
            raise AssertionError(
                "communication budget exceeded:\n  " + "\n  ".join(problems) + "\n" + self.table()
            )

    def assert_same_as(self, other: CommStats, *, group: str | None = None, op: str | None = None) -> None:
        """Both saw the same calls and bytes per (rank, group, op); else ``AssertionError`` with the difference."""
        mine = {k: v for k, v in self.summary().items() if self._matches(k[1], k[2], group, op)}
        theirs = {k: v for k, v in other.summary().items() if other._matches(k[1], k[2], group, op)}
        if mine == theirs:
            return
        lines = []
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key, CommCount()), theirs.get(key, CommCount())
            if a != b:
                r, g, o = key
                lines.append(
                    f"rank {r} {g} {o}: {a.calls} calls / {a.bytes} B here, "
                    f"{b.calls} calls / {b.bytes} B there"
                )
        raise AssertionError("communication differs:\n  " + "\n  ".join(lines))


def active() -> tuple[CommStats, ...]:
    """The CommStats blocks active in this thread (innermost last)."""
    return _ACTIVE.get()


def _parse_key(key: str) -> tuple[str | None, str | None]:
    if not isinstance(key, str) or not key:
        raise ValueError(f"a budget key must be 'group', 'group:op', '*:op' or '*', got {key!r}")
    group, _, op = key.partition(":")
    return (None if group == "*" else group), (op or None)
