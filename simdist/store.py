"""The world's c10d store, whose waits give up the run token.

A ``HashStore`` blocks a missing key's ``get``/``wait`` in C++ while its thread
keeps the run token: the rank that would set the key could never run. This
store is plain Python (c10d calls it through its Python-store trampoline, so
``PrefixStore``, DeviceMesh and user code all reach it) and waits in the
scheduler like a collective, so a scheduled world stays live and a key that no
rank will ever set is reported as a deadlock instead of a timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ._core import identity
from ._core.records import Waitable
from ._core.scheduler import Scheduler
from ._isolation import patches


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class _StoreWait(Waitable):
    """A store wait: done once every key of ``keys`` exists; or, with no keys,
    a rank polling the store (``add(key, 0)`` or ``check`` in a loop) with
    nothing changed since its last poll, done at the store's next change (a
    polling rank would otherwise keep the run token, and the peers whose
    writes it polls for would never run). Any rank may set keys, so it names
    no needed rank; the scheduler reports it stuck only when no rank can run."""

    def __init__(self, description: str, keys: Sequence[str] = ()) -> None:
        self.description = description
        self.keys = list(keys)

    def needed_ranks(self) -> Sequence[int]:
        return ()

    def describe(self) -> str:
        return self.description


# Polls in a row, with nothing changed, after which a rank waits for a change.
_POLLS_BEFORE_WAITING = 2


class RankStore(dist.Store):
    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__()
        self._scheduler = scheduler
        self._data: dict[str, bytes] = {}
        # Rank waits by the first key they still miss: a write looks only at
        # the waits on its key (a store-based barrier of n ranks would
        # otherwise scan every waiting rank on each of its n writes).
        self._waits: dict[str, list[tuple[int, _StoreWait]]] = {}
        # Threads outside the world's ranks (the caller, helpers) wait on this.
        self._changed = threading.Condition()
        # Busy polls: the store's change count, each rank's last poll (the
        # count it saw, the call, how many such polls in a row saw it), and
        # the parked pollers.
        self._version = 0
        self._polls: dict[int, tuple[int, str, int]] = {}
        self._pollers: list[tuple[int, _StoreWait]] = []
        self._timeout_s = 300.0

    # -- c10d's Store interface -------------------------------------------

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout_s = timeout.total_seconds()

    def set(self, key: str, value: Any) -> None:
        with self._changed:
            self._data[key] = _as_bytes(value)
            self._notify_locked(key)

    def get(self, key: str) -> bytes:
        return self.multi_get([key])[0]

    def add(self, key: str, amount: int) -> int:
        if int(amount) == 0:
            self._polled(f"add({key!r}, 0)")
        with self._changed:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            if amount:
                self._notify_locked(key)
            return value

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        with self._changed:
            current = self._data.get(key)
            expected_b = _as_bytes(expected)
            if (current is None and expected_b == b"") or current == expected_b:
                self._data[key] = _as_bytes(desired)
                self._notify_locked(key)
                return self._data[key]
            return expected_b if current is None else current

    def append(self, key: str, value: Any) -> None:
        with self._changed:
            self._data[key] = self._data.get(key, b"") + _as_bytes(value)
            self._notify_locked(key)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.wait(keys)
        with self._changed:
            return [self._data[k] for k in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        with self._changed:
            for k, v in zip(keys, values):
                self._data[k] = _as_bytes(v)
            self._notify_locked(*keys)

    def check(self, keys: list[str]) -> bool:
        with self._changed:
            if all(k in self._data for k in keys):
                return True
        self._polled(f"check({keys})")
        with self._changed:
            return all(k in self._data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self._changed:
            deleted = self._data.pop(key, None) is not None
            if deleted:
                self._notify_locked(key)
            return deleted

    def num_keys(self) -> int:
        with self._changed:
            return len(self._data)

    def delete_through(self, store: dist.PrefixStore, key: str) -> bool:
        """``delete_key(key)`` of a PrefixStore over this store. A PrefixStore
        does not expose its prefix, so a probe key is written through it and
        looked up (under the lock: nobody sees the probe)."""
        probe = f"__simdist_probe_{id(store)}"
        with self._changed:  # re-entrant: the probe's set takes it again
            store.set(probe, "")
            full = next(k for k in self._data if k.endswith(probe))
            del self._data[full]
            return self._data.pop(full[: -len(probe)] + key, None) is not None

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        with self._changed:
            if all(k in self._data for k in keys):
                return
            rank = self._rank_of_caller()
            if rank is None:  # a thread outside the world's ranks (the caller, a helper)
                if not self._changed.wait_for(lambda: all(k in self._data for k in keys), self._timeout_s):
                    raise dist.DistStoreError(
                        f"simdist store: timed out after {self._timeout_s:g} s waiting for key(s) {keys}"
                    )
                return
            pending = _StoreWait(f"a store wait for key(s) {list(keys)}", keys)
            self._park_locked(rank, pending)
        self._scheduler.wait(rank, pending)

    # -- internals ---------------------------------------------------------

    def _rank_of_caller(self) -> int | None:
        me = identity.me
        world = me.world
        if world is None or getattr(world, "scheduler", None) is not self._scheduler:
            return None
        return me.rank

    def _park_locked(self, rank: int, pending: _StoreWait) -> bool:
        """File ``pending`` under its first missing key; False when none is missing."""
        for k in pending.keys:
            if k not in self._data:
                self._waits.setdefault(k, []).append((rank, pending))
                return True
        return False

    def _polled(self, what: str) -> None:
        """A read a loop may repeat: the third time in a row a rank makes the
        same read (same call, same keys) of an unchanged store, it waits for
        the store to change. Reads of different keys never count together:
        code that checks several optional keys once each goes on."""
        with self._changed:
            rank = self._rank_of_caller()
            if rank is None:
                return
            seen, last, count = self._polls.get(rank, (-1, "", 0))
            count = count + 1 if seen == self._version and last == what else 0
            self._polls[rank] = (self._version, what, count)
            if count < _POLLS_BEFORE_WAITING:
                return
            pending = _StoreWait(f"a store poll ({what}, repeated with nothing changed) waiting for a change")
            self._pollers.append((rank, pending))
        self._scheduler.wait(rank, pending)

    def _notify_locked(self, *keys: str) -> None:
        self._version += 1
        if self._pollers:
            pollers, self._pollers = self._pollers, []
            for poller, change in pollers:
                self._scheduler.complete(poller, change)
        self._changed.notify_all()
        for key in keys:
            waits = self._waits.pop(key, None)
            for rank, waitable in waits or ():
                if not self._park_locked(rank, waitable):
                    self._scheduler.complete(rank, waitable)


# -- reaching num_keys/delete_key through c10d's PrefixStore ----------------------
#
# c10d wraps the world's store in C++ PrefixStores (the default store, each
# group's and device's prefix). C++ reaches a Python store through a trampoline
# that forwards get/set/wait/... but not getNumKeys/deleteKey: they raised
# "Tried to call pure virtual function". While runs are in progress
# PrefixStore's two Python methods are therefore routed here when the store
# under the prefixes is a RankStore (other stores keep torch's own methods);
# the patch is the registry's "prefix store" (``_isolation.patches``).

_torch_methods: dict[str, Any] = {}  # what PrefixStore's methods resolve to without the patch
_own: dict[str, Any] = {}  # what PrefixStore's own __dict__ held (nothing: they are Store's)
_MISSING = object()


def _rank_store_under(store: Any) -> RankStore | None:
    inner = getattr(store, "_underlying_non_prefix_store", None)
    return inner if isinstance(inner, RankStore) else None


def _prefix_num_keys(self: dist.PrefixStore) -> int:
    inner = _rank_store_under(self)
    if inner is None:
        return _torch_methods["num_keys"](self)
    return inner.num_keys()  # as HashStore under prefixes: every key of the store


def _prefix_delete_key(self: dist.PrefixStore, key: str) -> bool:
    inner = _rank_store_under(self)
    if inner is None:
        return _torch_methods["delete_key"](self, key)
    return inner.delete_through(self, key)


_OURS = {"num_keys": _prefix_num_keys, "delete_key": _prefix_delete_key}


def _install() -> None:
    for name, ours in _OURS.items():
        _own[name] = vars(dist.PrefixStore).get(name, _MISSING)
        _torch_methods[name] = getattr(dist.PrefixStore, name)
        setattr(dist.PrefixStore, name, ours)


def _uninstall() -> None:
    for name, own in _own.items():
        if own is _MISSING:
            delattr(dist.PrefixStore, name)  # inherited from Store again
        else:
            setattr(dist.PrefixStore, name, own)
    _own.clear()  # (_torch_methods kept: a call that found our method just before still uses it)


patches.register(
    "prefix store", _install, _uninstall, [(dist.PrefixStore, "num_keys"), (dist.PrefixStore, "delete_key")]
)
