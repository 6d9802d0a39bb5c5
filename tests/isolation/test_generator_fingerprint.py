"""torch's CPU generator is swapped lazily: a switch reads its state only when
its in-place fingerprint changed. Every way a rank can move the generator
must still reach the rank's own stream, as in a process of its own.

The reference is independent of the swap: each rank's program replayed on its
own, one after the other, in the caller's thread, from the run's start state.
The last test breaks the fingerprint on purpose (a constant, the state words
alone, the engine without the cached sample) and checks that the program
then disagrees with the reference: the paths do reach what each part covers.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._isolation import generators

STEPS = 3
WORLD = 2


def _one_draw(rank: int, step: int) -> None:
    # Fewer than 624 words: only the engine's left/next move, not its state words.
    torch.rand(1)


def _randn(rank: int, step: int) -> None:
    torch.randn(5 + rank)


def _manual_seed(rank: int, step: int) -> None:
    torch.manual_seed(1000 + 10 * rank + step)


def _set_state(rank: int, step: int) -> None:
    torch.default_generator.set_state(torch.Generator().manual_seed(7 * rank + step).get_state())


def _cached_sample(rank: int, step: int) -> None:
    """Only the cached double normal sample changes (the engine stays)."""
    state = bytearray(bytes(torch.default_generator.get_state().numpy()))
    struct.pack_into("<d", state, generators._LEGACY_NORMAL_Y, 0.25 + rank + step / 8)
    struct.pack_into("<i", state, generators._LEGACY_NORMAL_VALID, 1)
    torch.default_generator.set_state(torch.frombuffer(state, dtype=torch.uint8).clone())


def _dropout(rank: int, step: int) -> None:
    torch.nn.Dropout(0.5).train()(torch.ones(16))


def _fork_rng(rank: int, step: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.rand(700)  # restored on exit: the stream goes on as without it
    torch.rand(1 + rank)


def _helper_thread(rank: int, step: int) -> None:
    """A thread the rank starts draws while the rank holds the run token (a
    join would hand the token on first: the helper would then draw from
    whichever rank runs, see docs/torch-state.md)."""
    drawn: list[torch.Tensor] = []
    helper = threading.Thread(target=lambda: drawn.append(torch.rand(3 + rank)))
    helper.start()
    while not drawn:
        time.sleep(0.001)
    helper.join()


PATHS: dict[str, Callable[[int, int], None]] = {
    "one_draw": _one_draw,
    "randn": _randn,
    "manual_seed": _manual_seed,
    "Generator.set_state": _set_state,
    "cached_sample": _cached_sample,
    "dropout": _dropout,
    "fork_rng": _fork_rng,
    "helper_thread": _helper_thread,
}


def _reveal() -> list[float]:
    # rand shows the engine; randn of one double shows a cached sample first.
    return torch.rand(2).tolist() + torch.randn(1, dtype=torch.float64).tolist()


def _body(ctx: Any, path: str) -> list[list[float]]:
    got = []
    for step in range(STEPS):
        PATHS[path](ctx.rank, step)
        dist.all_reduce(torch.zeros(1))  # the run token changes hands here
        got.append(_reveal())
    return got


def _reference(path: str, start: torch.Tensor) -> list[list[list[float]]]:
    out = []
    for rank in range(WORLD):
        torch.set_rng_state(start)
        got = []
        for step in range(STEPS):
            PATHS[path](rank, step)
            got.append(_reveal())
        out.append(got)
    return out


@pytest.fixture
def start_state() -> Iterator[torch.Tensor]:
    saved = torch.get_rng_state()
    torch.manual_seed(20261202)
    start = torch.get_rng_state()
    try:
        yield start
    finally:
        torch.set_rng_state(saved)


def _run_and_reference(path: str, start: torch.Tensor, broken: bool = False) -> tuple[list[Any], list[Any]]:
    torch.set_rng_state(start)
    results = simdist.run(_body, world_size=WORLD, args=(path,), timeout=120)
    if not broken:  # (a broken fingerprint cannot see that the caller's state needs putting back)
        assert torch.equal(torch.get_rng_state(), start), "the caller's generator is put back"
    return results, _reference(path, start)


def test_the_in_place_fingerprint_is_found_on_this_torch() -> None:
    """Otherwise every switch reads the state and nothing here tests the fast path."""
    assert generators._TORCH_CPU_FINGERPRINT is not None


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_rank_keeps_its_own_stream_whatever_moves_the_generator(
    path: str, start_state: torch.Tensor
) -> None:
    results, reference = _run_and_reference(path, start_state)
    assert results == reference


def test_a_changed_state_always_changes_the_fingerprint(start_state: torch.Tensor) -> None:
    """get_state is the reference: each step below changes it, and the
    fingerprint must change with it."""
    fingerprint = generators._TORCH_CPU_FINGERPRINT
    assert fingerprint is not None
    steps: list[Callable[[], Any]] = [
        lambda: torch.rand(1),
        lambda: torch.randn(1, dtype=torch.float64),  # caches the second sample
        lambda: torch.randn(1, dtype=torch.float64),  # spends it
        lambda: torch.rand(2000),  # past 624 words: the state words are regenerated
        lambda: torch.manual_seed(5),
        lambda: _cached_sample(0, 0),
        lambda: torch.default_generator.set_state(start_state),
        lambda: torch.randint(0, 10, (3,)),
        lambda: torch.randperm(20),
        lambda: torch.empty(4).exponential_(),
    ]
    for i, step in enumerate(steps):
        before_state, before = torch.get_rng_state(), fingerprint()
        step()
        assert not torch.equal(torch.get_rng_state(), before_state), f"step {i} changes the state"
        assert fingerprint() != before, f"step {i}"


_HEAD = generators._ENGINE_HEAD.size
_WORDS = generators._ENGINE_WORDS.size


@pytest.mark.parametrize(
    "broken, path",
    [
        (lambda real: b"constant", "randn"),
        (lambda real: real()[_HEAD : _HEAD + _WORDS], "one_draw"),  # misses left/next
        (lambda real: real()[: _HEAD + _WORDS], "cached_sample"),  # misses the cached sample
    ],
    ids=["constant", "state-words-only", "engine-only"],
)
def test_a_fingerprint_that_misses_a_change_makes_the_program_fail(
    broken: Callable[[Callable[[], bytes]], bytes],
    path: str,
    start_state: torch.Tensor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = generators._TORCH_CPU_FINGERPRINT
    assert real is not None
    monkeypatch.setattr(generators, "_TORCH_CPU_FINGERPRINT", lambda: broken(real))
    results, reference = _run_and_reference(path, start_state, broken=True)
    assert results != reference
