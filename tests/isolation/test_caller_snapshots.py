"""Whatever the caller did to its generators between runs, every rank must
start from the caller's state as it is now, and the caller must get exactly
that state back (the first switch trusts in-place fingerprints instead of
reading every generator again, so a fingerprint that misses a change would
hand ranks a stale state).

The reference is plain single-thread maths in the caller: the same draws made
from the same state, one after the other, with nothing of simdist involved.
numpy's case is the one a fingerprint of the state words alone gets wrong:
``seed(0)`` then one Gaussian leaves the very words that ``seed(0)`` then two
Gaussians leave; only the cached second sample tells them apart.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import simdist
from simdist._isolation import generators

WORLD = 3


def _draws(ctx: simdist.RankContext) -> tuple[float, float, float]:
    return torch.randn(1).item(), random.random(), float(np.random.normal())


def _reference() -> tuple[float, float, float]:
    """What each rank draws from the caller's state, made in the caller and
    then undone (every rank starts from the same state)."""
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    drawn = (torch.randn(1).item(), random.random(), float(np.random.normal()))
    torch.set_rng_state(saved[0])
    random.setstate(saved[1])
    np.random.set_state(saved[2])
    return drawn


def _caller_state() -> tuple[Any, ...]:
    return (bytes(torch.get_rng_state().numpy()), random.getstate(), _np_state())


def _np_state() -> tuple[Any, ...]:
    name, words, pos, has_gauss, gauss = np.random.get_state()
    return name, words.tobytes(), pos, has_gauss, gauss


def _seeded_then_one_gaussian() -> None:
    np.random.seed(0)
    np.random.normal()  # the pair's second sample is cached


def _seeded_then_two_gaussians() -> None:
    np.random.seed(0)
    np.random.normal()
    np.random.normal()  # the cached sample spent: the same words, none cached


CHANGES: dict[str, Callable[[], None]] = {
    "nothing": lambda: None,
    "torch.manual_seed": lambda: torch.manual_seed(11),
    "torch draws": lambda: torch.rand(3),
    "random.seed": lambda: random.seed(12),
    "numpy seed": lambda: np.random.seed(13),
    "numpy cached gaussian": _seeded_then_one_gaussian,
    "numpy cached gaussian spent": _seeded_then_two_gaussians,
}


@pytest.mark.parametrize("before", ["numpy cached gaussian spent", "numpy cached gaussian", "nothing"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_every_rank_starts_from_the_callers_state_as_it_is_now(before: str, change: str) -> None:
    CHANGES[before]()
    first = simdist.run(_draws, world_size=WORLD)  # leaves its caller's state remembered
    assert first == [first[0]] * WORLD
    CHANGES[change]()
    expected = _reference()
    held = _caller_state()
    results = simdist.run(_draws, world_size=WORLD)
    assert results == [expected] * WORLD
    assert _caller_state() == held  # the caller's own state, back exactly


def test_the_cached_gaussian_case_needs_more_than_the_state_words() -> None:
    """The guard against a fingerprint of the words alone: the two numpy states
    this file tells apart do have the same words (else the case tests nothing)."""
    _seeded_then_two_gaussians()
    spent = np.random.get_state()
    _seeded_then_one_gaussian()
    cached = np.random.get_state()
    assert (spent[1] == cached[1]).all() and spent[2] == cached[2]
    assert (spent[3], cached[3]) == (0, 1)


@pytest.mark.skipif(
    generators._NUMPY_GAUSS_OFFSET is None, reason="numpy's cached Gaussian is not read in place here"
)
def test_numpys_fingerprint_sees_the_cached_gaussian() -> None:
    fingerprint = generators._numpy_fingerprint()
    assert fingerprint is not None and generators.numpy_fingerprint_whole()
    _seeded_then_two_gaussians()
    spent = fingerprint()
    _seeded_then_one_gaussian()
    assert fingerprint() != spent
