"""Isolation promises under creative use (round 3): rank_local entries that
cannot be swapped or copied, a run whose tear-down fails, DTensor imported
first inside the ranks, a thread outside the run drawing random numbers, and
Ctrl-C while a nested run's rank computes."""

from __future__ import annotations

import concurrent.futures
import copy
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import simdist

TIMEOUT = 60.0
MAIN = threading.main_thread().ident
HERE = Path(__file__).resolve().parent


def process_patches() -> dict[str, Any]:
    """Everything a run patches process-wide, as the caller sees it."""
    return {
        "Thread.start": threading.Thread.start,
        "Thread.join": threading.Thread.join,
        "Future.result": concurrent.futures.Future.result,
        "Future.exception": concurrent.futures.Future.exception,
        "Executor.submit": concurrent.futures.ThreadPoolExecutor.submit,
        "Executor.__init__": concurrent.futures.ThreadPoolExecutor.__init__,
        "c10d._world": type(c10d._world),
        "c10d._register_process_group": c10d._register_process_group,
        "meta_path": list(sys.meta_path),
    }


def plain_run_works() -> None:
    assert simdist.run(lambda ctx: ctx.rank, world_size=2, timeout=TIMEOUT) == [0, 1]


# -- point 3: entries that cannot be swapped; a tear-down that fails -------------


class ReadOnly:
    @property
    def value(self) -> int:
        return 1


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: int = 1


class Slotted:
    __slots__ = ("kept",)


@pytest.mark.parametrize(
    "entry, name",
    [
        ((ReadOnly(), "value"), "ReadOnly.value"),
        ((Frozen(), "value"), "Frozen.value"),
        ((Slotted(), "missing"), "Slotted.missing"),
    ],
    ids=["read-only property", "frozen dataclass", "slots without it"],
)
def test_an_attribute_that_cannot_be_set_is_refused_before_any_rank_starts(entry: Any, name: str) -> None:
    before = process_patches()
    started: list[int] = []
    with pytest.raises(ValueError, match=rf"rank_local\[1\]: {name} cannot be swapped per rank") as info:
        simdist.run(
            lambda ctx: started.append(ctx.rank),
            world_size=2,
            timeout=TIMEOUT,
            rank_local=[(sys.modules[__name__], "TIMEOUT"), entry],
        )
    assert "setting it raised" in str(info.value)
    assert started == []
    assert process_patches() == before
    plain_run_works()  # (it failed with "property ... has no setter" on every later run)


class Flaky:
    """An attribute whose setter starts failing during the run."""

    def __init__(self) -> None:
        self._value = 0
        self.broken = False

    @property
    def value(self) -> int:
        return self._value

    @value.setter
    def value(self, v: int) -> None:
        if self.broken:
            raise RuntimeError("flaky setter refuses")
        self._value = v


def breaks_the_setter_body(ctx: simdist.RankContext, obj: Flaky) -> int:
    obj.value = 10 + ctx.rank
    dist.barrier()
    if ctx.rank == ctx.world_size - 1:
        obj.broken = True  # shared: every later write of the slot fails
    return ctx.rank


def test_a_run_whose_tear_down_fails_leaves_no_owner_behind() -> None:
    obj = Flaky()
    before = process_patches()
    with pytest.raises((RuntimeError, simdist.RankError)):
        simdist.run(
            breaks_the_setter_body,
            world_size=2,
            timeout=TIMEOUT,
            args=(obj,),
            share_args=True,
            rank_local=[(obj, "value")],
        )
    assert process_patches() == before
    # Every later run, plain or scheduled, is clean although the setter
    # still refuses (it used to be retried by every later run, which failed).
    plain_run_works()
    assert simdist.run(lambda ctx: torch.rand(1).item(), world_size=2, timeout=TIMEOUT)


# -- point 5: values that cannot be deep-copied -------------------------------------

lock_module = types.ModuleType("simdist_round3_lock_module")
lock_module.STATE = {"lock": threading.Lock(), "n": 3}  # type: ignore[attr-defined]
sys.modules[lock_module.__name__] = lock_module


def counts_under_the_lock_body(ctx: simdist.RankContext) -> tuple[int, list[int]]:
    state = lock_module.STATE  # type: ignore[attr-defined]
    with state["lock"]:
        state["n"] = ctx.rank
    dist.barrier()
    seen = [0] * ctx.world_size
    dist.all_gather_object(seen, state["n"])
    return state["n"], seen


def test_a_global_that_cannot_be_deep_copied_is_refused_up_front() -> None:
    original = lock_module.STATE  # type: ignore[attr-defined]
    with pytest.raises(
        TypeError, match=r"rank_local\[0\]: module simdist_round3_lock_module's global 'STATE'"
    ) as info:
        simdist.run(
            counts_under_the_lock_body, world_size=3, timeout=TIMEOUT, rank_local=[lock_module.__name__]
        )
    message = str(info.value)
    assert "cannot be deep-copied" in message and "copy function" in message
    assert lock_module.STATE is original and original["n"] == 3  # type: ignore[attr-defined]
    plain_run_works()


def fresh_lock_copy(value: Any) -> Any:
    """A rank's own copy: a new lock where deepcopy refuses one."""
    if isinstance(value, dict):
        return {k: threading.Lock() if k == "lock" else copy.deepcopy(v) for k, v in value.items()}
    return copy.deepcopy(value)


def test_a_copy_function_gives_each_rank_its_own_value_and_the_caller_gets_its_back() -> None:
    original = lock_module.STATE  # type: ignore[attr-defined]
    lock = original["lock"]
    results = simdist.run(
        counts_under_the_lock_body,
        world_size=3,
        timeout=TIMEOUT,
        rank_local=[(lock_module, fresh_lock_copy)],
    )
    # Each rank kept its own n (it was (3, [0, 1, 2])-style sharing before: all saw the last).
    assert results == [(r, [0, 1, 2]) for r in range(3)]
    assert lock_module.STATE is original and original["n"] == 3 and original["lock"] is lock  # type: ignore[attr-defined]


class Holder:
    pass


def writes_to_its_file_body(ctx: simdist.RankContext, holder: Holder) -> str:
    holder.log.write(f"rank {ctx.rank}\n")  # type: ignore[attr-defined]
    holder.log.flush()  # type: ignore[attr-defined]
    return str(holder.log.name)  # type: ignore[attr-defined]


def test_an_open_file_attribute_is_refused_or_reopened_per_rank(tmp_path: Path) -> None:
    holder = Holder()
    caller_path = tmp_path / "caller.log"
    with open(caller_path, "w") as log:
        holder.log = log  # type: ignore[attr-defined]
        with pytest.raises(
            TypeError, match=r"rank_local\[0\]: Holder.log \(TextIOWrapper\) cannot be deep-copied"
        ):
            simdist.run(
                writes_to_its_file_body,
                world_size=2,
                timeout=TIMEOUT,
                args=(holder,),
                share_args=True,
                rank_local=[(holder, "log")],
            )
        opened: list[Any] = []

        def reopen(_: Any) -> Any:
            f = open(tmp_path / f"rank{len(opened)}.log", "w")  # closed below
            opened.append(f)
            return f

        names = simdist.run(
            writes_to_its_file_body,
            world_size=2,
            timeout=TIMEOUT,
            args=(holder,),
            share_args=True,
            rank_local=[(holder, "log", reopen)],
        )
        assert holder.log is log  # type: ignore[attr-defined]
    for f in opened:
        f.close()
    assert sorted(Path(n).name for n in names) == ["rank0.log", "rank1.log"]
    assert caller_path.read_text() == ""  # no rank wrote to the caller's file
    assert sorted(Path(n).read_text() for n in names) == ["rank 0\n", "rank 1\n"]


def test_a_copy_function_in_the_wrong_place_is_refused_naming_the_entry() -> None:
    with pytest.raises(TypeError, match=r"rank_local\[0\]: a copy function goes with a module"):
        simdist.run(lambda ctx: 0, world_size=1, timeout=TIMEOUT, rank_local=[(Holder(), copy.deepcopy)])


# -- point 4: DTensor imported first inside the ranks ---------------------------------


def test_dtensor_first_imported_inside_the_ranks_keeps_loss_parallel_per_rank() -> None:
    """In a fresh interpreter (this one has imported DTensor long ago)."""
    root = HERE.parents[1]  # the repository: this checkout's simdist, not an installed one
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(HERE / "late_dtensor_program.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )


# -- point 8: a thread outside the run drawing random numbers ---------------------------


def lets_an_outsider_draw_body(
    ctx: simdist.RankContext, go: threading.Event, drawn: threading.Event
) -> list[float]:
    torch.manual_seed(1000 + ctx.rank)
    if ctx.rank == 0:
        go.set()  # the outsider draws now, while rank 0 executes (holds the process)
        assert drawn.wait(30)
    return torch.rand(2).tolist()


def test_a_thread_outside_the_run_draws_from_the_executing_ranks_generator() -> None:
    """Pinned, as docs/scheduling.md documents: the process has one torch generator.
    While a rank of a scheduled run executes it holds that rank's state, so a
    thread outside the run that draws then draws from the rank's stream (and
    the rank's next draws are shifted); its own stream is not the process's.
    Seed such a thread's own torch.Generator to keep it apart."""
    go, drawn = threading.Event(), threading.Event()
    outsider: list[float] = []
    own: list[float] = []

    def outside() -> None:
        assert go.wait(30)
        outsider.append(torch.rand(1).item())
        gen = torch.Generator().manual_seed(5)
        own.append(torch.rand(1, generator=gen).item())
        drawn.set()

    torch.manual_seed(77)
    caller = torch.get_rng_state()
    thread = threading.Thread(target=outside)
    thread.start()
    results = simdist.run(
        lets_an_outsider_draw_body, world_size=2, timeout=TIMEOUT, args=(go, drawn), share_args=True
    )
    thread.join(30)
    stream0 = torch.rand(3, generator=torch.Generator().manual_seed(1000)).tolist()
    stream1 = torch.rand(2, generator=torch.Generator().manual_seed(1001)).tolist()
    assert outsider == [pytest.approx(stream0[0])]  # rank 0's first number
    assert results[0] == pytest.approx(stream0[1:])  # rank 0's stream, shifted by one
    assert results[1] == pytest.approx(stream1)  # other ranks are untouched
    assert torch.equal(torch.get_rng_state(), caller)  # the caller's stream: not drawn from
    assert own == [pytest.approx(torch.rand(1, generator=torch.Generator().manual_seed(5)).item())]


# -- point 9: Ctrl-C while a nested run's rank computes -------------------------------------


def nested_spinning_body(ctx: simdist.RankContext, interrupted: list[str]) -> int:
    if ctx.rank == 0:
        threading.Timer(0.5, signal.pthread_kill, (MAIN, signal.SIGINT)).start()
    end = time.monotonic() + 30.0
    try:
        while time.monotonic() < end:  # compute-bound: only an interrupt stops it early
            pass
    except simdist.SimulationError as exc:
        interrupted.append(type(exc).__name__)
        raise
    return ctx.rank


def outer_starts_a_nested_run_body(ctx: simdist.RankContext, interrupted: list[str]) -> Any:
    return simdist.run(
        nested_spinning_body, world_size=2, timeout=120.0, args=(interrupted,), share_args=True
    )


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
    reason="Ctrl-C is not delivered as KeyboardInterrupt in this process",
)
def test_ctrl_c_while_a_nested_runs_rank_computes_reaches_the_caller() -> None:
    """The caller used to wait on the process lock the nested rank held until
    that rank's loop ended by itself: judged by the nested rank being stopped."""
    assert threading.current_thread() is threading.main_thread()
    interrupted: list[str] = []
    torch.manual_seed(3)
    state = torch.get_rng_state()
    before = process_patches()
    with pytest.raises(KeyboardInterrupt):
        simdist.run(
            outer_starts_a_nested_run_body, world_size=1, timeout=120.0, args=(interrupted,), share_args=True
        )
    assert interrupted == ["SimulationError"]  # the nested rank was stopped, not left to finish
    assert torch.equal(torch.get_rng_state(), state)
    assert not dist.is_initialized()
    deadline = time.monotonic() + 30
    while process_patches() != before and time.monotonic() < deadline:
        time.sleep(0.05)  # routing ends when the last rank thread has left
    assert process_patches() == before
    plain_run_works()


def test_a_copy_function_that_raises_fails_the_run_and_restores_the_caller() -> None:
    original = lock_module.STATE  # type: ignore[attr-defined]

    def refuses(value: Any) -> Any:
        raise OSError("cannot reopen")

    with pytest.raises(simdist.RankError) as info:
        simdist.run(
            counts_under_the_lock_body, world_size=2, timeout=TIMEOUT, rank_local=[(lock_module, refuses)]
        )
    assert isinstance(info.value.__cause__, OSError) and "cannot reopen" in str(info.value.__cause__)
    assert lock_module.STATE is original and original["n"] == 3  # type: ignore[attr-defined]
    plain_run_works()
