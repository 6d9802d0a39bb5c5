"""simdist reads every thread's frame without CPython 3.11's collector deadlock.

``sys._current_frames()`` can start a garbage collection while it holds the
interpreter's thread-list lock; collecting a ``threading.local`` takes that
lock again and the process hangs with the GIL held (CPython gh-106883). The
subprocess below makes that likely: busy threads (fresh frames to wrap),
cycles holding thread-locals, a collector threshold of one. With plain
``sys._current_frames()`` it hangs on this project's CPython 3.11.7 (measured:
killed by the timeout); with simdist's helper, which every report, watchdog
and debugger path uses, it finishes.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import simdist
from simdist._core.frames import current_frames

_SCRIPT = textwrap.dedent(
    """
    import gc, threading
    from simdist._core.frames import current_frames

    stop = False

    def step(n):
        return n + 1

    def busy():
        x = 0
        while not stop:
            x = step(x)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    gc.set_threshold(1, 1, 1)
    for _ in range(20000):
        garbage = [threading.local()]
        garbage.append(garbage)
        del garbage
        frames = current_frames()
        assert threading.get_ident() in frames
    stop = True
    print("finished", flush=True)
    """
)


def test_frames_while_the_collector_frees_thread_locals_do_not_hang_the_process() -> None:
    done = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finished" in done.stdout


def test_the_collector_is_left_as_it_was() -> None:
    assert gc.isenabled()
    frames = current_frames()
    assert gc.isenabled()
    assert frames[threading.get_ident()] is not None
    gc.disable()
    try:
        current_frames()
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()


def test_every_live_thread_is_listed() -> None:
    started, stop = threading.Event(), threading.Event()

    def wait() -> None:
        started.set()
        stop.wait(30)

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    started.wait(30)
    try:
        assert t.ident in current_frames()
    finally:
        stop.set()
        t.join(30)


def test_simdist_reads_frames_only_through_the_helper() -> None:
    # A plain sys._current_frames() anywhere in simdist brings the hang back.
    root = Path(simdist.__file__).parent
    direct = [
        str(path.relative_to(root))
        for path in sorted(root.rglob("*.py"))
        if path.name != "frames.py" and "sys._current_frames(" in path.read_text()
    ]
    assert direct == [], f"call simdist._core.frames.current_frames() instead in: {direct}"
