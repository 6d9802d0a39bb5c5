"""The collective sanitizer: a rank's ops racing with its own async calls in flight.

While a rank has an async collective or P2P issued and not yet waited, its
``RankBook`` (``book``) holds the call (``inflight``) and its dispatch mode
(``mode``) is on the rank's thread: each op's tensor arguments, classified
read or written from the op's schema (``accesses``), are compared by the
memory they cover (``footprint``) with the call's buffers; a clash is an
``AsyncRaceError`` (``report``). The backend calls in here: ``issued`` when
it makes a Work (saying whether c10d waits for it at once, ``synchronous``:
then nothing goes in flight), ``waited`` when a Work in flight is waited,
``quietly`` around its own tensor work, and the rank's life calls
``body_returned`` and ``rank_left``. See docs/sanitizer.md ("How it works").

A call c10d waits for before the program's next line never goes in flight (a
race needs an op of the rank between issue and wait), so it pays nothing;
anything not recognised as synchronous is treated as asynchronous, so a
torch whose c10d changes shape costs time, never a missed race.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import torch.autograd
import torch.autograd.graph
from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack
from torch.distributed import distributed_c10d as c10d

from .._core import identity
from .._core.records import P2POp, PendingCollective
from .._isolation import patches
from .book import GroupOrder, RankBook
from .mode import here

__all__ = [
    "body_returned",
    "helper_ended",
    "helper_started",
    "issued",
    "other_modes_active",
    "quietly",
    "rank_left",
    "synchronous_collective",
    "synchronous_p2p",
    "waited",
]

_KEY = "_simdist_sanitizer"  # the world's books, one per rank (False: the run turned it off)
_R = TypeVar("_R")


def _books(world: Any) -> Any:
    books = world.__dict__.get(_KEY)
    if books is None:
        options = getattr(world, "options", None)
        if options is None or not options.check_async:
            books = False
        else:
            order = GroupOrder(every_group=options.check_group_order)
            books = [RankBook(r, options.strict_async, order) for r in range(world.world_size)]
        # Atomic: ranks (and their helper threads) of a concurrent schedule may
        # get here at once. Every thread must use the one list that is kept; a
        # call put in a list that lost the race is never waited there, and the
        # mode of that list's book would report it forever.
        books = world.__dict__.setdefault(_KEY, books)
    return books


def _book(rank: int) -> RankBook | None:
    world = identity.me.world
    if world is None:
        return None
    books = _books(world)
    return books[rank] if books else None


def issued(work: Any, rank: int, waitable: Any, synchronous: bool = False) -> bool:
    """A Work was made for a collective or P2P of ``rank``: in flight until
    waited. Returns whether it went in flight (only then is ``waited`` needed).

    Kept flat: every call of every rank comes here, synchronous ones included.
    """
    world = identity.me.world
    if world is None:
        return False
    books = world.__dict__.get(_KEY)
    if books is None:
        books = _books(world)
    if not books or not isinstance(waitable, (PendingCollective, P2POp)):
        return False  # off, or a composite of other Works (coalesced forms): its parts are registered
    book: RankBook = books[rank]
    if synchronous and not book.entries and not book.helpers:
        return False  # waited before the rank's next op, alone (book.issued says why)
    return book.issued(work, waitable, synchronous)


def waited(work: Any, rank: int) -> None:
    book = _book(rank)
    if book is not None and book.entries:
        book.waited(work)


def in_flight_on(rank: int, group: str) -> tuple[Any, ...]:
    """The Works ``rank`` has in flight on ``group`` now: a barrier issued
    next completes them (gloo's barrier waits for the group's earlier work;
    NCCL's waits for its stream, which they share)."""
    book = _book(rank)
    if book is None or not book.entries:
        return ()
    return tuple(e.work for e in book.entries.values() if e.group_name == group)


def quietly(fn: Callable[..., _R], *args: Any) -> _R:
    """``fn(*args)`` unseen by the sanitizer: simdist's own tensor work (a
    completion writing outputs, a send's snapshot) is the backend, not the rank."""
    if not _len_torch_dispatch_stack():
        return fn(*args)
    here.quiet += 1
    try:
        return fn(*args)
    finally:
        here.quiet -= 1


def other_modes_active() -> bool:
    """Whether a dispatch mode other than simdist's own (the sanitizer's, CUDA
    emulation's) is on this thread's stack (the modes simdist shows its
    collectives to, as gloo's path would)."""
    n = _len_torch_dispatch_stack()
    if not n:
        return False
    return any(not getattr(_get_dispatch_stack_at(i), "simdist_own_mode", False) for i in range(n))


def resync() -> None:
    """Put this thread's mode back in step with its rank's calls (after autograd
    restored the thread's dispatch state it saved when backward began)."""
    world = identity.me.world
    if world is not None:
        books = _books(world)
        if books:
            books[identity.me.rank].sync()


def synchronous_collective(opts: Any) -> bool:
    """Whether a collective's options say c10d waits for it at once: its
    wrappers set ``asyncOp`` from ``async_op``; C++ callers (DDP's reducer, the
    functional collectives) pass the default, ``asyncOp=True``."""
    return opts is not None and getattr(opts, "asyncOp", True) is False


def _code(fn: Any) -> Any:
    return inspect.unwrap(fn).__code__


# The two synchronous P2P wrappers (compared by identity: hashing a code
# object hashes its contents), and the files of the c10d frames that may stand
# between them and the backend (the wrappers themselves, c10d's logger).
_SEND, _RECV = _code(c10d.send), _code(c10d.recv)
_C10D_FILES = frozenset({_code(c10d.isend).co_filename, c10d.send.__code__.co_filename})
_MAX_C10D_FRAMES = 4


def synchronous_p2p(caller: FrameType | None) -> bool:
    """Whether the backend's send or recv, called from ``caller``, is inside
    ``dist.send``/``dist.recv`` (which call ``isend``/``irecv`` and wait at
    once); ``isend`` from the program, ``batch_isend_irecv`` or a pipeline
    schedule are in flight."""
    frame = caller
    for _ in range(_MAX_C10D_FRAMES):
        if frame is None:
            return False
        code = frame.f_code
        if code is _SEND or code is _RECV:
            return True
        if code.co_filename not in _C10D_FILES:
            return False
        frame = frame.f_back
    return False


def body_returned(world: Any, rank: int, result: Any) -> None:
    books = _books(world)
    if books:
        books[rank].ended(result)


def rank_left(world: Any, rank: int) -> None:
    books = world.__dict__.get(_KEY)
    if books:
        books[rank].leave()


def helper_started(world: Any, rank: int) -> None:
    books = _books(world)
    if books:
        books[rank].pin()


def helper_ended(world: Any, rank: int) -> None:
    books = world.__dict__.get(_KEY)
    if books:
        books[rank].unpin()


# Autograd restores a thread's dispatch modes as they were when backward
# began, taking off a mode a collective inside backward put on: this patch
# puts it back in step as ``backward()`` / ``autograd.grad()`` return.
_original: list[Any] = []
# The wrapper last built, with what it wraps: every run installs the patch
# again, and building the wrapper (``functools.wraps``) was most of the
# install. Matched by identity (whatever sits there may not be hashable).
_built: list[tuple[Any, Callable[..., Any]]] = []


def _install_backward_patch() -> None:
    original = torch.autograd.graph._engine_run_backward
    _original.append(original)
    if not _built or _built[0][0] is not original:

        @functools.wraps(original)
        def run_backward(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                resync()

        _built[:] = [(original, run_backward)]
    torch.autograd.graph._engine_run_backward = _built[0][1]
    torch.autograd._engine_run_backward = _built[0][1]  # its own import of it


def _uninstall_backward_patch() -> None:
    original = _original.pop()
    torch.autograd.graph._engine_run_backward = original
    torch.autograd._engine_run_backward = original  # its own import of it


patches.register(
    "async sanitizer",
    _install_backward_patch,
    _uninstall_backward_patch,
    [(torch.autograd.graph, "_engine_run_backward"), (torch.autograd, "_engine_run_backward")],
)
