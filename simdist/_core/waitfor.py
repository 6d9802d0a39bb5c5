"""The wait-for graph: which waiting ranks can never complete.

A graph maps each waiting rank to the ranks its wait needs (members that have
not joined a collective, the peer of a send or recv). A waiting rank can
complete only if every rank it needs is running or can itself complete; the
others form closed sets that nothing outside can ever wake. Pure functions,
no threading: the scheduler calls them under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Container


def cannot_complete(graph: dict[int, list[int]], running: Callable[[int], bool]) -> set[int]:
    """The waiting ranks (keys of ``graph``, each mapped to the ranks it needs)
    that can never complete: the complement of the least fixed point of
    "every rank it needs runs or can complete"."""
    blockers = {r: 0 for r in graph}
    dependents: dict[int, list[int]] = {}
    ready = []
    for r, needed in graph.items():
        for p in needed:
            if p in graph:
                blockers[r] += 1
                dependents.setdefault(p, []).append(r)
            elif not running(p):
                blockers[r] = -len(graph) - 1  # needs a rank that has left: never
        if blockers[r] == 0:
            ready.append(r)
    can: set[int] = set()
    while ready:
        r = ready.pop()
        can.add(r)
        for d in dependents.get(r, ()):
            blockers[d] -= 1
            if blockers[d] == 0:
                ready.append(d)
    return set(graph) - can


def cannot_complete_threads(waits: dict[int, list[list[int]]], running: Callable[[int], bool]) -> set[int]:
    """Like ``cannot_complete`` for ranks with several threads (helper
    threads a rank started). ``waits`` maps each rank whose every live thread
    waits to the ranks each of those threads needs. A rank can complete as
    soon as any one of its threads can (that thread then runs on); a thread
    can complete only if every rank it needs runs or can complete. With one
    thread per rank this is exactly ``cannot_complete``."""
    if all(len(lists) == 1 for lists in waits.values()):
        return cannot_complete({r: lists[0] for r, lists in waits.items()}, running)
    blockers: dict[tuple[int, int], int] = {}
    dependents: dict[int, list[tuple[int, int]]] = {}
    ready: list[int] = []
    for r, lists in waits.items():
        for i, needed in enumerate(lists):
            key = (r, i)
            blockers[key] = 0
            for p in set(needed):
                if p in waits:
                    blockers[key] += 1
                    dependents.setdefault(p, []).append(key)
                elif not running(p):
                    blockers[key] = -len(blockers) - len(waits) - 1  # never
            if blockers[key] == 0:
                ready.append(r)
    can: set[int] = set()
    while ready:
        r = ready.pop()
        if r in can:
            continue
        can.add(r)
        for key in dependents.get(r, ()):
            blockers[key] -= 1
            if blockers[key] == 0 and key[0] not in can:
                ready.append(key[0])
    return set(waits) - can


def deadlock_headline(
    graph: dict[int, list[int]], deadlocked: list[int], gone: set[int], all_wait: bool
) -> str:
    """Name the cycle (or the departed peers) that makes ``deadlocked`` stuck."""
    on_gone = sorted(r for r in deadlocked if any(p in gone for p in graph[r]))
    parts = ["every live rank is waiting and no pending call can complete"] if all_wait else []
    cycle = find_cycle(graph, set(deadlocked))
    if cycle:
        parts.append(
            f"rank(s) {sorted(cycle)} wait for each other in a cycle: "
            + " -> ".join(map(str, cycle + cycle[:1]))
        )
    if all_wait:
        return "deadlock: " + "; ".join(parts)  # each rank's line below says the rest
    if on_gone:
        parts.append(f"rank(s) {on_gone} wait on a peer that has already finished or failed")
    rest = sorted(set(deadlocked) - set(cycle) - set(on_gone))
    if rest:
        parts.append(f"rank(s) {rest} can never complete either, whatever the running ranks do")
    return "deadlock: " + "; ".join(parts)


def reachable(graph: dict[int, list[int]], start: int, within: set[int]) -> list[int]:
    """Ranks of ``within`` that ``start`` waits on, directly or not, nearest first."""
    order: list[int] = []
    seen: set[int] = set()
    frontier = [start]
    while frontier:
        nxt = []
        for r in frontier:
            for p in sorted(graph[r]):
                if p in within and p not in seen:
                    seen.add(p)
                    order.append(p)
                    nxt.append(p)
        frontier = nxt
    return order


def find_cycle(graph: dict[int, list[int]], within: set[int]) -> list[int]:
    """One cycle of the wait-for graph inside ``within`` (lowest rank first), or []."""
    for start in sorted(within):
        path: list[int] = []
        index: dict[int, int] = {}
        r: int | None = start
        while r is not None and r not in index:
            index[r] = len(path)
            path.append(r)
            r = next((p for p in sorted(graph[r]) if p in within), None)
        if r is not None:
            cycle = path[index[r] :]
            low = cycle.index(min(cycle))
            return cycle[low:] + cycle[:low]
    return []


def failed_roots(
    graph: dict[int, list[int]], stuck: set[int], failed: dict[int, int | None]
) -> dict[int, int | None]:
    """For each stuck rank, the failed rank it waits on (transitively), if any.
    ``failed``: each failed rank and the root failure it records."""
    roots: dict[int, int | None] = {}

    def root_of(r: int, path: set[int]) -> int | None:
        if r in roots:
            return roots[r]
        path.add(r)
        found: int | None = None
        for p in sorted(graph[r]):
            if p in failed:
                found = failed[p]
            elif p in stuck and p not in path:
                found = root_of(p, path)
            if found is not None:
                break
        path.discard(r)
        roots[r] = found
        return found

    for r in sorted(stuck):
        root_of(r, set())
    return roots


def deadlock_core(graph: dict[int, list[int]], deadlocked: set[int], gone: Container[int]) -> list[int]:
    """The core of a deadlock: ranks on a cycle, or waiting on a rank that has
    finished; the same whatever the timing."""
    return sorted(
        r for r in deadlocked if r in reachable(graph, r, deadlocked) or any(p in gone for p in graph[r])
    )
