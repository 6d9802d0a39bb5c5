"""Stacks on demand: ``simdist.debug.dump()`` and SIGUSR1, without stopping anything."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any, TextIO

from ._report import Text, dump_text

_stream_lock = threading.Lock()
_stream: TextIO | None = None  # where SIGUSR1 writes (pytest: the terminal, past its capture)


def set_stream(stream: TextIO | None) -> None:
    global _stream
    with _stream_lock:
        _stream = stream


def dump(file: TextIO | None = None) -> Text:
    """Print every live run's ranks and helpers (state, call with group and seq,
    stack with coordinates, flight-record tail) to ``file`` (default: stderr,
    or the terminal under pytest) and return the text. Safe from any thread,
    the stuck run goes on."""
    text = Text(dump_text())
    out = file or _stream or sys.stderr
    try:
        out.write(text + "\n")
        out.flush()
    except (OSError, ValueError):  # a closed stream: the text is still returned
        pass
    return text


def _on_signal(signum: int, frame: Any) -> None:
    dump()


def install_signal_handler(signum: int | None = None) -> None:
    """Print ``dump()`` on ``signum`` (default SIGUSR1); call from the main thread.

    simdist installs it at a run's start when nothing else handles SIGUSR1."""
    signal.signal(signal.SIGUSR1 if signum is None else signum, _on_signal)
