"""What the timing benchmarks share: another revision's tree, variants
measured in alternating rounds, child processes that report one JSON line,
the load average, and tables.

Imported by bare name: a benchmark run as ``python benchmarks/NAME.py`` has
this folder first on its path.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")


@contextmanager
def exported(rev: str, *paths: str) -> Iterator[Path]:
    """``paths`` of the repository (all of it when none) as of git revision
    ``rev``, in a temporary folder that is removed on leaving. A revision git
    cannot archive ends the script with a message naming it."""
    proc = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *paths], capture_output=True)
    if proc.returncode != 0:
        detail = proc.stderr.decode(errors="replace").strip()
        raise SystemExit(f"git cannot archive revision {rev!r}: {detail}")
    with tempfile.TemporaryDirectory(prefix="simdist-before-") as folder:
        with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
            # The "data" filter refuses links out of the folder; Pythons before
            # 3.11.4 have no filters (a git archive of this repository has no such links).
            if hasattr(tarfile, "data_filter"):
                tar.extractall(folder, filter="data")
            else:
                tar.extractall(folder)
        yield Path(folder)


def alternate(
    variants: Sequence[str], rounds: int, measure: Callable[[str], T], *, quiet: bool = False
) -> dict[str, list[T]]:
    """``measure(variant)`` for every variant, ``rounds`` times, in the
    reverse order every other round: a drift in the machine's load then
    falls on every variant alike, and none is always first (cold caches) or
    last. The samples per variant, in round order; a line on stderr per round
    unless ``quiet``."""
    samples: dict[str, list[T]] = {variant: [] for variant in variants}
    for r in range(rounds):
        for variant in variants if r % 2 == 0 else list(reversed(variants)):
            samples[variant].append(measure(variant))
        if not quiet:
            print(f"  round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
    return samples


class ChildFailed(Exception):
    """A child process gave no result; ``stderr`` is what it wrote there."""

    def __init__(self, reason: str, stderr: str = "") -> None:
        super().__init__(reason)
        self.stderr = stderr


def child_json(
    script: str,
    args: Iterable[object],
    *,
    path: Sequence[Path] = (),
    extra_env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``python SCRIPT ARGS...`` with ``path`` first on its PYTHONPATH
    (a tree's simdist before the checkout's) and return the last line of its
    stdout that is a JSON object. Raises ChildFailed when it times out,
    exits non-zero (a figure from a process that then failed is not to be
    trusted) or prints no such line."""
    env = {**os.environ, **(extra_env or {})}
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, path), *filter(None, [env.get("PYTHONPATH")])])
    command = [sys.executable, str(Path(script).resolve()), *map(str, args)]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"over {timeout:g} s") from None
    line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}, no output"])[-1]
        raise ChildFailed(tail, proc.stderr)
    result: dict[str, Any] = json.loads(line)
    return result


def load_line(when: str) -> str:
    """``load average WHEN: 0.52 (2 CPUs)``, the one-minute figure: timings
    taken beside other work are noise, and this says whether there was any."""
    try:
        load = f"{os.getloadavg()[0]:.2f}"
    except OSError:
        load = "n/a"
    return f"load average {when}: {load} ({os.cpu_count()} CPUs)"


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, markdown: bool = False, align: str = "<"
) -> None:
    """Print ``rows`` under ``headers``: markdown rows, or columns two spaces
    apart under a rule of dashes, each aligned by its character of ``align``
    (``<`` left, ``>`` right; the last one holds for the columns after it)."""
    cells = [[str(cell) for cell in row] + [""] * (len(headers) - len(row)) for row in rows]
    if markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "---|" * len(headers))
        for row in cells:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    sides = [align[min(i, len(align) - 1)] for i in range(len(headers))]
    for line in [list(headers), ["-" * w for w in widths], *cells]:
        padded = (c.rjust(w) if side == ">" else c.ljust(w) for c, w, side in zip(line, widths, sides))
        print("  ".join(padded).rstrip())
