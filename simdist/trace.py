"""Flight recorder (each rank's last N calls) and Chrome/Perfetto trace export."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import torch

DEFAULT_RECORDS = 32


class Record:
    """One collective or point-to-point call as seen by one rank.

    Built on every call, so it stores cheap references (the group, torch.Size
    objects, dtypes) and renders text only when a report or trace asks.
    """

    __slots__ = ("dtypes", "end", "group", "op", "rank", "seq", "shapes", "site", "start", "state")

    def __init__(
        self, rank: int, seq: int, group: Any, op: str, tensors: Sequence[torch.Tensor], site: str
    ) -> None:
        self.rank = rank
        self.seq = seq  # per group; -1 for point-to-point
        self.group = group  # a GroupInfo; its label may be refined after creation
        self.op = op
        self.shapes = [t.shape for t in tensors]
        self.dtypes = [t.dtype for t in tensors]
        self.site = site
        self.start = time.perf_counter()
        self.end: float | None = None
        self.state = "started"  # started -> completed | failed

    @property
    def group_label(self) -> str:
        return self.group.describe()

    @property
    def nbytes(self) -> int:
        return sum(math.prod(shape) * dtype.itemsize for shape, dtype in zip(self.shapes, self.dtypes))

    @property
    def dtype_names(self) -> list[str]:
        return sorted({str(d).replace("torch.", "") for d in self.dtypes})

    def line(self, t0: float) -> str:
        dur = "" if self.end is None else f" {1e3 * (self.end - self.start):.3f} ms"
        seq = "" if self.seq < 0 else f" seq {self.seq}"
        return (
            f"{self.op} on {self.group_label}{seq} shapes {[list(s) for s in self.shapes]} "
            f"{'/'.join(self.dtype_names)} {self.nbytes} B at {self.site}: {self.state}"
            f" (t={1e3 * (self.start - t0):.3f} ms{dur})"
        )


def tensors_of(payload: dict[str, Any]) -> list[torch.Tensor]:
    """Every tensor in a call's payload (lists flattened)."""
    out: list[torch.Tensor] = []
    for v in payload.values():
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


class Recorder:
    """Per-rank ring buffers of records, and optionally the full history."""

    def __init__(self, world_size: int, keep: int = DEFAULT_RECORDS, keep_all: bool = False) -> None:
        self.t0 = time.perf_counter()
        self._rings: list[deque[Record]] = [deque(maxlen=keep) for _ in range(world_size)]
        self._all: list[Record] | None = [] if keep_all else None
        self._lock = threading.Lock()

    def start(
        self, rank: int, seq: int, group: Any, op: str, tensors: Sequence[torch.Tensor], site: str
    ) -> Record:
        rec = Record(rank, seq, group, op, tensors, site)
        self._rings[rank].append(rec)  # deque.append is atomic; one writer per rank
        if self._all is not None:
            with self._lock:
                self._all.append(rec)
        return rec

    @staticmethod
    def finish(rec: Record | None, failed: bool) -> None:
        if rec is not None and rec.end is None:
            rec.end = time.perf_counter()
            rec.state = "failed" if failed else "completed"

    def tail(self, ranks: Iterable[int] | None = None, last: int = 4) -> str:
        lines = ["last calls per rank (flight recorder):"]
        for rank, ring in enumerate(self._rings):
            if ranks is not None and rank not in ranks:
                continue
            recs = list(ring)[-last:]
            if not recs:
                lines.append(f"  rank {rank}: no calls")
                continue
            lines.append(f"  rank {rank}:")
            lines.extend("    " + r.line(self.t0) for r in recs)
        return "\n".join(lines)

    def all_records(self) -> list[Record]:
        """Every call of the run, in start order (empty unless built with keep_all)."""
        return list(self._all or [])

    def write_chrome_trace(self, path: str | os.PathLike[str], describe_rank: Any) -> None:
        """One track per rank, one slice per call, coloured by group."""
        events: list[dict[str, Any]] = []
        names = sorted({r.group_label for r in (self._all or [])})
        palette = [
            "thread_state_running",
            "thread_state_iowait",
            "rail_response",
            "rail_animation",
            "good",
            "bad",
            "terrible",
            "generic_work",
            "cq_build_passed",
            "olive",
            "yellow",
        ]
        colour = {g: palette[i % len(palette)] for i, g in enumerate(names)}
        world_size = len(self._rings)
        for rank in range(world_size):
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": 0,
                    "tid": rank,
                    "args": {"name": f"rank {rank} ({describe_rank(rank)})"},
                }
            )
        for r in self._all or []:
            end = r.end if r.end is not None else time.perf_counter()
            events.append(
                {
                    "name": r.op,
                    "cat": r.group_label,
                    "ph": "X",
                    "pid": 0,
                    "tid": r.rank,
                    "ts": 1e6 * (r.start - self.t0),
                    "dur": max(1e6 * (end - r.start), 0.01),
                    "cname": colour[r.group_label],
                    "args": {
                        "group": r.group_label,
                        "axes": list(getattr(r.group, "axes", ())),
                        "seq": r.seq,
                        "shapes": [list(s) for s in r.shapes],
                        "dtypes": r.dtype_names,
                        "bytes": r.nbytes,
                        "site": r.site,
                        "state": r.state,
                    },
                }
            )
        with open(path, "w", encoding="utf-8") as fh:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, fh)
