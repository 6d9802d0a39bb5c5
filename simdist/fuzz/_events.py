"""The campaign's wire format: one JSON object a line, one file per worker.

Workers append; the campaign tails the files. Files (not pipes) keep a
worker's record intact when the campaign is interrupted, and make a run
directory something a person can read afterwards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

__all__ = ["EventReader", "EventWriter", "worker_file"]


def worker_file(run_dir: Path, index: int) -> Path:
    return run_dir / f"worker-{index}.jsonl"


class EventWriter:
    def __init__(self, path: Path) -> None:
        self._file: TextIO = open(path, "a", encoding="utf-8")

    def emit(self, kind: str, **fields: Any) -> None:
        fields["e"] = kind
        self._file.write(json.dumps(fields, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class EventReader:
    """Reads whole lines appended since the last call (a half-written line waits)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read_new(self) -> Iterator[dict[str, Any]]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return
        if size <= self._offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read(size - self._offset)
        self._offset = size
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                yield json.loads(line)
