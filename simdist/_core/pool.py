"""Rank threads kept parked between runs, and handed out again (docs/internals.md,
"Parked rank threads").

Starting and ending an OS thread cost more than everything else an empty
8-rank world does (about 0.25 ms of CPU a thread on a 2-core machine), so a
rank thread that ends its run cleanly is parked and runs a rank of the next
run. It must be indistinguishable from a new thread: its ``threading.local``
values are dropped, each task runs in a fresh ``contextvars.Context`` and
sees a ``threading.Thread`` object of its own (``_new_face``), the trace and
profile hooks are set as a new thread's, ``tidy`` (the caller's) empties
caches it knows of, and ``fingerprint`` (the caller's reading of torch's
thread state) must read as when the thread was new; otherwise, or if its
task raised or its run gave up on it, the thread ends. A parked thread is
taken out of ``threading._active`` (``_registry``), so ``enumerate()`` lists
only threads doing work.
"""

from __future__ import annotations

import _thread
import atexit
import contextvars
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from . import identity, reuse

# At most MAX_IDLE threads are parked, so a 4096-rank world's second run
# starts no thread (a parked thread keeps about 20 KB of touched stack). Past
# KEEP_IDLE, a thread parked for _PARK_S without a task ends: a process that
# ran one large world keeps no thousands of threads for the rest of its life.
# ``reuse.threads()`` False (SIMDIST_REUSE=0, SIMDIST_REUSE_THREADS=0) parks none.
MAX_IDLE = 4096
KEEP_IDLE = 128
_PARK_S = 60.0

_lock = threading.Lock()
_idle: list[_Worker] = []
_closing = False

# A borrowed reference: read as an address (a ``py_object`` result type would
# be taken as a new reference, and the thread state's dict freed under it).
_get_dict = ctypes.pythonapi.PyThreadState_GetDict
_get_dict.restype = ctypes.c_void_p
_get_dict.argtypes = []


class Seat:
    """One rank's use of a thread, what its run joins (for ``watchdog``).

    ``join`` is about the task: it returns once the task has ended and its
    thread is parked again (or has ended)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.released = threading.Event()  # set once the thread is parked or about to end
        self.abandoned = False  # the run gave up on it: its thread must not be parked again
        self.worker: _Worker | None = None
        self.simdist_exited: threading.Event | None = None  # set by the run layer

    @property
    def ident(self) -> int | None:
        return None if self.worker is None else self.worker.thread.ident

    def join(self, timeout: float | None = None) -> None:
        worker = self.worker
        if worker is None or worker.thread.ident is None:
            return
        if self.released.wait(timeout) and worker.ending:
            worker.thread.join(timeout)


def _nothing() -> None:
    pass


def _new_face(name: str) -> threading.Thread | None:
    """A ``Thread`` object for one task, as user code sees its thread: never
    started by ``threading`` itself, it takes the running thread's ids when
    the task begins and a lock of its own in place of the one CPython frees
    when a thread ends, released when the task ends (so ``is_alive()`` turns
    False and ``join()`` returns, as for a thread that has ended). None on a
    Python whose ``Thread`` is not built so (then no thread is parked)."""
    face = threading.Thread(name=name, daemon=True)
    if getattr(face, "_tstate_lock", 0) is not None or not hasattr(face, "_started"):
        return None
    lock = _thread.allocate_lock()
    lock.acquire()
    face._tstate_lock = lock  # type: ignore[attr-defined]  # private: what is_alive()/join() wait on
    face._simdist_helper = False  # type: ignore[attr-defined]  # a rank, never a helper
    return face


# Whether this Python's Thread objects can be made per task (else none is parked).
_FACES = _new_face("simdist-probe") is not None


def _take_off(face: threading.Thread) -> None:
    """The task has ended: its ``Thread`` object reads as a thread that has."""
    lock = face._tstate_lock  # type: ignore[attr-defined]  # private: see _new_face
    if lock is not None and lock.locked():
        lock.release()


class _Worker:
    __slots__ = (
        "ending",
        "face",
        "fingerprint",
        "parked",
        "permit",
        "pristine",
        "seat",
        "target",
        "thread",
        "tidy",
    )

    def __init__(self) -> None:
        self.permit = threading.Lock()
        self.permit.acquire()
        self.seat: Seat | None = None
        self.target: Callable[[], None] = _nothing
        self.fingerprint: Callable[[], Any] = lambda: None
        self.tidy: Callable[[], None] = _nothing
        self.pristine: Any = None
        self.ending = False
        self.parked = False  # in _idle (written with _lock held)
        self.thread: threading.Thread = threading.current_thread()
        self.face: threading.Thread | None = None

    def assign(
        self,
        seat: Seat,
        target: Callable[[], None],
        fingerprint: Callable[[], Any],
        tidy: Callable[[], None],
    ) -> None:
        seat.worker = self
        self.seat = seat
        self.target = target
        self.fingerprint = fingerprint
        self.tidy = tidy
        self.face = _new_face(seat.name)

    def main(self) -> None:
        """A new thread's life: tasks until one cannot be followed by another."""
        _keep_dump_signal_for_the_main_thread()
        self.thread = threading.current_thread()
        self.pristine = self.fingerprint()
        identity.mark_pooled(threading.get_ident())
        try:
            while True:
                seat = self.seat
                assert seat is not None
                self._run_task(seat)
                if not self._park(seat):
                    return
        finally:
            with _lock:
                if self in _idle:
                    _idle.remove(self)
            # Its seat still reaches it (a run joins through the seat); the
            # way back would be a cycle left for the collector.
            self.seat = None
            identity.forget_pooled(threading.get_ident())

    def _run_task(self, seat: Seat) -> None:
        thread, face = self.thread, self.face
        thread.name = seat.name
        if face is not None:
            _show(thread, face)  # its task's own Thread object
        # What a new thread's bootstrap installs now, None included: a hook
        # removed since the last task must not stay set on this thread.
        sys.settrace(threading.gettrace())
        sys.setprofile(threading.getprofile())
        try:
            contextvars.Context().run(self.target)
        except BaseException:
            self.ending = True
            seat.released.set()
            raise
        finally:
            if face is not None:
                _take_off(face)
            thread._daemonic = True  # type: ignore[attr-defined]  # private: the flag a new thread inherits
            # A parked thread keeps nothing of its last run alive.
            self.target = _nothing
            self.face = None

    def _park(self, seat: Seat) -> bool:
        """Park the thread for a later task (True once it has one), or end it."""
        ident = threading.get_ident()
        try:
            # Hooks are set afresh at the next start; parked, none runs.
            sys.settrace(None)
            sys.setprofile(None)
            _drop_thread_locals()
            self.tidy()
            clean = self.fingerprint() == self.pristine
        except Exception:
            clean = False  # a state it cannot read is not one it can vouch for
        with _lock:
            # Without a Thread object of its own per task (another Python's
            # threading), a reused thread would show the last task's.
            keep = clean and _FACES and not seat.abandoned and not _closing and len(_idle) < capacity()
            if keep:
                keep = self._park_locked(ident)
        if not keep:
            self.ending = True
            seat.released.set()
            return False
        seat.released.set()
        while True:
            # Parked until a run takes it (the wait is bounded only so that it
            # stays a loop); never listed, never interrupted (see ``identity``).
            # Whether it has a task is decided under the lock, never by the
            # wake-up alone: a spare permit only costs another look.
            woken = self.permit.acquire(timeout=_PARK_S)
            with _lock:
                if self.ending:
                    return False
                if not woken and self.parked and len(_idle) > KEEP_IDLE:
                    _idle.remove(self)  # long idle, past the threads always kept: end
                    self.parked = False
                    self.ending = True
                    _show(self.thread)  # listed again, as threading's own exit expects
                    return False
                if not self.parked:
                    if self.seat is not None:
                        return True
                    if not self._park_locked(ident):  # taken by a start that failed before giving it a task
                        self.ending = True
                        return False

    def _park_locked(self, ident: int) -> bool:
        """Park this (the calling) thread; False when it cannot be hidden."""
        if not _hide(ident):
            return False
        self.seat = None
        self.parked = True
        _idle.append(self)
        return True


def _keep_dump_signal_for_the_main_thread() -> None:
    """Block SIGUSR1 in this rank thread and the threads it starts, so the
    stack dump (``debug._report``) comes while a run is stuck
    (docs/threads-and-exits.md, "SIGUSR1 while a run is stuck")."""
    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is not None and hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {usr1})


def _drop_thread_locals() -> None:
    """Forget this thread's ``threading.local`` values, as its exit would:
    CPython keeps each in the thread state's dict under a key of its own."""
    address = _get_dict()
    state: dict[Any, Any] = ctypes.cast(address, ctypes.py_object).value if address else {}
    for key in [k for k, v in state.items() if type(v).__name__ == "_localdummy"]:
        del state[key]


# Where threading's private registry is looked up, at every use (never bound
# at import: a forked child gets a new lock).
_internals: Any = threading


def _registry() -> tuple[dict[int, threading.Thread], Any] | None:
    """threading's registry of live threads (what ``enumerate()`` lists) and
    its lock, or None on a Python that does not keep them as CPython does:
    there no thread is parked, since a parked thread still listed would look
    like a thread leaked by the run (docs/internals.md)."""
    registry = getattr(_internals, "_active", None)
    lock = getattr(_internals, "_active_limbo_lock", None)
    if type(registry) is not dict or lock is None:
        return None
    # Keyed by thread id, as CPython's: the calling thread is found under its own.
    if registry.get(threading.get_ident()) is not threading.current_thread():
        return None
    return registry, lock


def _hide(ident: int) -> bool:
    """Take the calling thread out of the registry; False when it has none."""
    found = _registry()
    if found is None:
        return False
    registry, lock = found
    with lock:
        registry.pop(ident, None)
    return True


def _show(thread: threading.Thread, face: threading.Thread | None = None) -> None:
    """List a parked thread again, as ``face`` when given (its task's, given
    the ids of the OS thread behind ``thread``)."""
    assert thread.ident is not None
    found = _registry()
    if found is None:
        return  # taken away while the thread was parked: it stays unlisted
    registry, lock = found
    if face is not None:
        face._ident = thread.ident  # type: ignore[attr-defined]  # private: what .ident reads
        if hasattr(face, "_native_id"):
            face._native_id = thread.native_id
        face._started.set()  # type: ignore[attr-defined]  # private: the flag start() sets
    with lock:
        registry[thread.ident] = thread if face is None else face


def capacity() -> int:
    """How many threads may be parked now (0 while reuse is off)."""
    return MAX_IDLE if reuse.threads() else 0


def idle_count() -> int:
    """How many threads are parked right now."""
    with _lock:
        return len(_idle)


class StartFailed(RuntimeError):
    """A thread could not be started (the OS refused: thread or memory limits)."""


class StartTimedOut(StartFailed):
    """The deadline passed before every thread was started (thousands of ranks
    under a short timeout: the OS starts each thread, a fraction of a ms)."""

    def __init__(self, message: str, started: int) -> None:
        super().__init__(message)
        self.started = started


class ThreadStart:
    """Build ``n`` threads running ``target(i)``; ``start()`` starts them all.

    The first thread starts every other before it runs its own target, while
    the caller waits for all of them to have started: the caller is never left
    blocked in ``Thread.start`` when the OS refuses a thread, and a deadline
    stops the starting between two threads. Starting them in a tree was slower
    (docs/internals.md, the speed audit)."""

    def __init__(
        self,
        n: int,
        target: Callable[[int], None],
        name: Callable[[int], str],
        deadline: float | None = None,
    ) -> None:
        self._n = n
        self._deadline = deadline  # time.monotonic(): no thread is started after it
        self._target = target
        self._lock = threading.Lock()
        self._started = 0
        self._done = threading.Event()
        self._error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._run, args=(i,), name=name(i), daemon=True) for i in range(n)
        ]

    def _start_others(self) -> None:
        for child in range(1, self._n):
            try:
                if self._deadline is not None and time.monotonic() > self._deadline:
                    raise StartTimedOut("the deadline passed", self._started)
                self.threads[child].start()
            except BaseException as exc:
                with self._lock:
                    if self._error is None:
                        self._error = exc
                self._done.set()
                return

    def _run(self, i: int) -> None:
        if i == 0:
            self._start_others()
        with self._lock:
            self._started += 1
            if self._started == self._n:
                self._done.set()
        self._target(i)

    def start(self) -> None:
        """Start every thread; return once each has started. If the OS refused
        one, raise ``StartFailed`` (the threads that did start keep running:
        the caller must take them down)."""
        try:
            self.threads[0].start()
        except BaseException as exc:
            raise StartFailed(f"could not start thread {self.threads[0].name}: {exc}") from exc
        self._done.wait()
        if isinstance(self._error, StartTimedOut):
            raise StartTimedOut(
                f"the deadline passed with {self._started} of {self._n} threads started", self._started
            )
        if self._error is not None:
            raise StartFailed(
                f"could not start every thread ({self._started} of {self._n} started): {self._error}"
            ) from self._error


class PooledStart:
    """``n`` seats running ``target(i)``, on parked threads first, then on new
    ones (the first starts the others, see ``ThreadStart``); ``start()`` starts them all. The
    seats exist before ``start()``, so a caller can take them down if it fails."""

    def __init__(
        self,
        n: int,
        target: Callable[[int], None],
        name: Callable[[int], str],
        fingerprint: Callable[[], Any] = lambda: None,
        tidy: Callable[[], None] = _nothing,
    ) -> None:
        self.threads = [Seat(name(i)) for i in range(n)]
        self._target = target
        self._name = name
        self._fingerprint = fingerprint
        self._tidy = tidy

    def start(self, deadline: float | None = None) -> None:
        """Return once every seat's thread runs; a thread the OS refused
        raises ``StartFailed``, and new threads still to start when
        ``deadline`` (``time.monotonic()``) passes ``StartTimedOut``
        (the others keep running)."""
        n, seats = len(self.threads), self.threads
        taken: list[_Worker] = []
        try:
            with _lock:
                # Taken and given its task under one hold of the lock: a parked
                # thread woken early sees either no task (and waits on) or its task.
                # Without threading's registry a parked thread could not be
                # listed again: it stays parked (ended at exit), new ones start.
                # With reuse switched off since they parked, none is taken either.
                reusable: list[_Worker] = _idle if _registry() is not None and reuse.threads() else []
                while reusable and len(taken) < n:
                    worker = reusable.pop()
                    worker.parked = False
                    taken.append(worker)
                    _show(worker.thread)  # listed again before it runs anything
                for i, (seat, worker) in enumerate(zip(seats, taken)):
                    worker.assign(seat, _bound(self._target, i), self._fingerprint, self._tidy)
                    _show(worker.thread, worker.face)  # as its task's own Thread object
            fresh = [_Worker() for _ in range(n - len(taken))]
            for i, (seat, worker) in enumerate(zip(seats[len(taken) :], fresh), start=len(taken)):
                worker.assign(seat, _bound(self._target, i), self._fingerprint, self._tidy)
        finally:
            # Even if interrupted here: a taken thread left without a task
            # would stay listed and parked for ever (it parks itself again).
            for worker in taken:
                try:
                    worker.permit.release()
                except RuntimeError:
                    pass  # a permit is already pending
        if fresh:
            offset, name = len(taken), self._name
            starter = ThreadStart(len(fresh), lambda i: fresh[i].main(), lambda i: name(offset + i), deadline)
            for worker, thread in zip(fresh, starter.threads):
                worker.thread = thread
                thread._simdist_helper = False  # type: ignore[attr-defined]  # a rank, never a helper
            starter.start()


def _bound(target: Callable[[int], None], i: int) -> Callable[[], None]:
    return lambda: target(i)


def _close() -> None:
    """Interpreter exit: end every parked thread."""
    global _closing
    with _lock:
        _closing = True
        parked = list(_idle)
        _idle.clear()
        for worker in parked:
            worker.ending = True
            _show(worker.thread)
    for worker in parked:
        worker.permit.release()
    for worker in parked:
        worker.thread.join(1.0)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _idle.clear()  # their threads do not exist in the child


atexit.register(_close)
os.register_at_fork(after_in_child=_after_fork_in_child)
