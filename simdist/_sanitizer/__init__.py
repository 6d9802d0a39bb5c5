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
``body_returned`` and ``rank_left``. See docs/sanitizer.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch._C import _get_dispatch_stack_at, _len_torch_dispatch_stack

from .._core import identity
from .._core.records import P2POp, PendingCollective
from .backward import register as register_backward_patch
from .book import RankBook
from .group_order import GroupOrder
from .mode import here
from .synchronous import collective as synchronous_collective
from .synchronous import p2p as synchronous_p2p

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


register_backward_patch(resync)
