"""Every process-wide patch simdist makes is the registry's (``simdist/_isolation/patches.py``):
in place while runs are in progress, and the process's own values again once the last run ends.

The reference is the process itself: the attributes of the modules and classes
simdist patches, read before any run, and whether a value is a function of
simdist's. A run that uses the debugger and the world's store through c10d's
prefixes exercises every patch a run installs.
"""

from __future__ import annotations

import bdb
import concurrent.futures
import concurrent.futures.thread
import io
import pdb
import sys
import threading
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import simdist
from simdist._isolation import patches

TIMEOUT = 60.0

# Everything a run could plausibly patch: the modules and classes simdist
# touches, with their neighbours (a patch moved to a sibling is still caught).
OWNERS: list[Any] = [
    dist,
    c10d,
    dist.Store,
    dist.PrefixStore,
    dist.HashStore,
    dist.ProcessGroup,
    threading,
    threading.Thread,
    concurrent.futures,
    concurrent.futures.thread,
    concurrent.futures.Future,
    concurrent.futures.ThreadPoolExecutor,
    pdb,
    pdb.Pdb,
    bdb,
    bdb.Bdb,
    sys,
]
# sys attributes that change by themselves (pytest's capture, the last traceback).
_SYS_MOVING = {"stdin", "stdout", "stderr", "last_type", "last_value", "last_traceback", "ps1", "ps2"}


_ABSENT = object()


def _name(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or owner.__name__


def snapshot() -> dict[str, Any]:
    """Every attribute of ``OWNERS``, by its owner's own ``__dict__`` (lists by their items)."""
    out: dict[str, Any] = {}
    for owner in OWNERS:
        for attr, value in list(vars(owner).items()):
            if (owner is sys and attr in _SYS_MOVING) or attr == "reduce_op":  # (deprecated: warns when read)
                continue
            out[f"{_name(owner)}.{attr}"] = tuple(value) if isinstance(value, list) else value
    return out


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) is tuple and a == b)


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The attributes rebound (or lists changed) between two snapshots."""
    return sorted(
        k for k in before.keys() | after.keys() if not _same(before.get(k, _ABSENT), after.get(k, _ABSENT))
    )


def simdist_functions(values: dict[str, Any]) -> list[str]:
    """The attributes whose value is a function defined by simdist (a patch left in place)."""
    return sorted(
        k for k, v in values.items() if str(getattr(v, "__module__", "") or "").startswith("simdist")
    )


def debugger_and_store(ctx: simdist.RankContext) -> tuple[int, bool, str, dict[str, Any], list[str]]:
    inner = snapshot()
    installed = patches.installed()
    store = dist.distributed_c10d._get_default_store()  # a PrefixStore over the world's store
    store.set("k", "v")
    count = store.num_keys()
    deleted = store.delete_key("k")
    shown = io.StringIO()
    if ctx.rank == 0:
        # Any Pdb stopping in a rank names the rank (the "debugger" patch).
        pdb.Pdb(stdin=io.StringIO("c\n"), stdout=shown, readrc=False).set_trace()
    dist.barrier()
    return count, deleted, shown.getvalue(), inner, installed


def test_outside_runs_no_attribute_is_simdists_and_a_run_changes_only_the_registrys() -> None:
    before = snapshot()
    assert simdist_functions(before) == [], "a patch was left in place by an earlier test"
    out = simdist.run(debugger_and_store, world_size=2, timeout=TIMEOUT)
    after = snapshot()
    assert changed(before, after) == []
    assert simdist_functions(after) == []
    # The run itself: every change it made is a place the registry names.
    known = {f"{_name(owner)}.{attr}" for _patch, owner, attr in patches.places()}
    during = out[0][3]
    assert set(changed(before, during)) <= known, sorted(set(changed(before, during)) - known)
    # ... and the patched behaviour was there: the store through its prefixes, the rank's prompt.
    assert [(o[0] >= 1, o[1]) for o in out] == [(True, True), (True, True)]
    assert "rank 0 of 2 stopped here" in out[0][2] and "every other rank is frozen" in out[0][2]


def test_the_registry_lists_every_patch_a_run_installs_and_each_is_undone() -> None:
    assert patches.installed() == []
    before = patches.current_values()
    names = {name for name, _owner, _attr in patches.places()}
    assert names == set(patches.ORDER)  # each patch names the places it changes
    out = simdist.run(debugger_and_store, world_size=2, timeout=TIMEOUT)
    installed = out[0][4]  # (the import hook too, where Megatron is installed but not imported)
    assert set(patches.RUN_PATCHES) <= set(installed)
    during = snapshot_of_places(out[0][3])
    for name in installed:
        moved = [k for k in before if k.startswith(f"{name}: ") and not _same(during[k], before[k])]
        assert moved, f"the {name!r} patch changed none of the places it names during the run"
    assert patches.installed() == []
    assert patches.current_values() == before


def snapshot_of_places(inner: dict[str, Any]) -> dict[str, Any]:
    """The registry's places as a rank saw them (read from that rank's full snapshot)."""
    return {
        f"{name}: {_name(owner)}.{attr}": inner.get(f"{_name(owner)}.{attr}", "<absent>")
        for name, owner, attr in patches.places()
    }


def test_a_patched_method_a_thread_kept_from_a_run_still_works_after_it() -> None:
    # Code that looked a method up during a run (a bound reference, an import
    # by name) calls simdist's wrapper later: it must reach the original.
    kept: dict[str, Any] = {}

    def keep(ctx: simdist.RankContext) -> None:
        kept.update(
            start=threading.Thread.start,
            join=threading.Thread.join,
            num_keys=dist.PrefixStore.num_keys,
            unregister=c10d._unregister_process_group,
        )

    simdist.run(keep, world_size=1, timeout=TIMEOUT)
    ran: list[int] = []
    thread = threading.Thread(target=lambda: ran.append(1))
    kept["start"](thread)
    kept["join"](thread, TIMEOUT)
    assert ran == [1]
    store = dist.PrefixStore("p", dist.HashStore())
    store.set("a", "1")
    assert kept["num_keys"](store) == store.num_keys() == 1
    assert kept["unregister"]("no such group") is c10d._unregister_process_group("no such group")
