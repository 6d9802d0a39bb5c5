"""Every process-wide patch simdist makes, in one ordered, refcounted registry.

While runs are in progress simdist changes things a process has once. Each
module that owns a patch registers it under its name in ``ORDER``, with the
attributes it replaces (so this module imports none of them): the
``import hook`` (``rank_local_defaults``), ``c10d routing`` (``c10d_state``
and ``c10d_imports``; it stays until the last rank thread has left, even
after the last run returned), ``ddp logging`` (``_backend.ddp_logging``),
``prefix store`` (``simdist.store``), ``debugger`` (``debug._pdb``),
``helper threads`` (``helpers``), ``profiler`` (``profiler``), ``async
sanitizer`` (``_sanitizer``'s backward patch) and ``cuda emulation``
(``_cuda.patch``; only runs with ``cuda="emulate"`` lease it).

Each patch is installed by the first run that needs it, in ``ORDER``, and
removed by the last, in the reverse order; a run holds a ``Lease`` on the
patches it needs. A lease whose set-up fails removes what it had installed
before raising, and releasing a lease twice does nothing, so a run that fails
anywhere leaves the process as it was. A patch removed restores only what it
changed: a place that holds, when the patch is removed, neither what the
patch put there nor a value the runs' own code set (c10d's
``init_process_group`` wrapping ``sys.excepthook`` in a rank) was changed by
somebody else since (the caller set ``sys.excepthook``, wrapped
``Thread.start``) and keeps that value (with the runs' own wrappers peeled
off: ``peel``). Outside runs every attribute a patch names holds the
process's own value again (``current_values``: what tests compare before and
after runs).

Not patches, so not here: the process hold of ``hold`` (a record, never a
lock held across calls: nothing to install or leave behind); per-run state
swapped at token switches and given back to the caller by ``rank_state``;
and the SIGUSR1 stack dump (``debug._report``), a signal handler set once and
only where the process has none, kept on purpose so that a hung process can
be asked for its stacks at any time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

_ABSENT = "<absent>"


class Patch:
    """One process-wide change: how to make it and undo it, what it replaces, and how many use it."""

    __slots__ = ("changes", "install", "name", "peel", "put", "spaces", "uninstall", "users")

    def __init__(
        self,
        name: str,
        install: Callable[[], None],
        uninstall: Callable[[], None],
        changes: Sequence[tuple[object, str]],
        peel: Callable[[object, str, object], object] | None = None,
    ) -> None:
        self.name = name
        self.install = install
        self.uninstall = uninstall
        self.changes = tuple(changes)
        # Each place's own namespace, live (a module's dict, a class's
        # mappingproxy), looked up once: read at every set-up and take-down.
        self.spaces = tuple((owner, vars(owner), attribute) for owner, attribute in self.changes)
        self.peel = peel
        self.put: list[object] = []  # what each place held once installed
        self.users = 0

    def set_up(self) -> None:
        self.install()
        # What each place holds, read from its own namespace (not what a class inherits).
        self.put = [space.get(attribute, _ABSENT) for _, space, attribute in self.spaces]

    def take_down(self) -> None:
        """Uninstall; a place somebody else changed since keeps their value."""
        theirs = []
        for (owner, space, attribute), put in zip(self.spaces, self.put):
            now = space.get(attribute, _ABSENT)
            if now is put or now is _ABSENT or isinstance(now, list):
                continue  # ours, or a list (a patch takes out only its own items)
            found = now if self.peel is None else self.peel(owner, attribute, now)
            if found is None or found is put:
                continue  # set by the runs' own code, over what the patch put
            theirs.append((owner, attribute, found))
        try:
            self.uninstall()
        finally:
            for owner, attribute, value in theirs:
                setattr(owner, attribute, value)


# Installed in this order, removed in the reverse one.
ORDER = (
    "import hook",
    "c10d routing",
    "ddp logging",
    "prefix store",
    "debugger",
    "helper threads",
    "profiler",
    "async sanitizer",
    "cuda emulation",
)
# What every run needs: the import hook only for runs that may import
# Megatron, CUDA emulation only for runs that ask for it.
RUN_PATCHES = ORDER[1:-1]
_BY_NAME: dict[str, Patch] = {}


def register(
    name: str,
    install: Callable[[], None],
    uninstall: Callable[[], None],
    changes: Sequence[tuple[object, str]],
    peel: Callable[[object, str, object], object] | None = None,
) -> None:
    """Called once by the module that owns the patch (at its import).
    ``changes`` lists the ``(object, attribute)`` places the patch rebinds
    (or whose contents it changes, for a list such as ``sys.meta_path``);
    ``peel(owner, attribute, value)`` takes the runs' own changes off a
    value found there at removal: None when the runs' code set it all,
    else what is left (what somebody else set, or what the patch put)."""
    if name not in ORDER:
        raise ValueError(f"simdist patch {name!r} is not in patches.ORDER {ORDER}")
    _BY_NAME[name] = Patch(name, install, uninstall, changes, peel)


Replacements = Sequence[tuple[object, str, object]]


def swap_in(originals: dict[str, Any], replacements: Replacements) -> None:
    """Put each ``(owner, attribute, new)`` in place, keeping what it replaces
    in ``originals`` under the attribute's name."""
    for owner, attribute, new in replacements:
        originals[attribute] = getattr(owner, attribute)
        setattr(owner, attribute, new)


def swap_out(originals: dict[str, Any], replacements: Replacements) -> None:
    """Put the originals back. ``originals`` is kept: a thread that found a
    replacement just before (a start, a join) still calls through it."""
    for owner, attribute, _ in replacements:
        setattr(owner, attribute, originals[attribute])


def register_swap(name: str, originals: dict[str, Any], replacements: Replacements) -> None:
    """``register`` a patch that only replaces attributes (``swap_in``/``swap_out``)."""
    register(
        name,
        lambda: swap_in(originals, replacements),
        lambda: swap_out(originals, replacements),
        [(owner, attribute) for owner, attribute, _ in replacements],
    )


_lock = threading.RLock()  # (a patch's own install may take a lease: re-entrant)


class Lease:
    """A run's hold on some patches; ``release`` gives them back once."""

    def __init__(self, patches: list[Patch]) -> None:
        self._patches = patches

    def release(self) -> None:
        with _lock:
            patches, self._patches = self._patches, []
            error: BaseException | None = None
            for patch in reversed(patches):
                patch.users -= 1
                if patch.users == 0:
                    try:
                        patch.take_down()
                    except Exception as exc:  # remove the others all the same
                        error = error or exc
            if error is not None:
                raise error


def lease(names: Sequence[str] = RUN_PATCHES) -> Lease:
    """Install (or count another user of) the named patches, in ``ORDER``."""
    unknown = [n for n in names if n not in _BY_NAME]
    if unknown:
        raise ValueError(f"unknown simdist patch(es) {unknown}; registered: {list(_BY_NAME)}")
    wanted = [_BY_NAME[n] for n in ORDER if n in names]
    taken: list[Patch] = []
    with _lock:
        try:
            for patch in wanted:
                if patch.users == 0:
                    patch.set_up()
                patch.users += 1
                taken.append(patch)
        except BaseException:
            Lease(taken).release()
            raise
    return Lease(taken)


def installed() -> list[str]:
    """The patches in place now (for tests and diagnostics)."""
    with _lock:
        return [n for n in ORDER if n in _BY_NAME and _BY_NAME[n].users]


def places() -> list[tuple[str, object, str]]:
    """``(patch, object, attribute)`` for every place a registered patch changes, in ``ORDER``."""
    with _lock:
        return [(n, owner, attr) for n in ORDER if n in _BY_NAME for owner, attr in _BY_NAME[n].changes]


def current_values() -> dict[str, object]:
    """What each of those places holds now, keyed ``"patch: Owner.attribute"``:
    read from the object's own ``__dict__`` (what a patch rebinds, not what
    a class inherits), a list by its items (``sys.meta_path``)."""
    out: dict[str, object] = {}
    for name, owner, attribute in places():
        value = vars(owner).get(attribute, _ABSENT)
        label = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
        out[f"{name}: {label}.{attribute}"] = tuple(value) if isinstance(value, list) else value
    return out
