"""Differential suite: the same SPMD programs on simdist and on a real gloo world.

Each layout starts one gloo world (spawned processes) and one simulated world
and runs every program of ``spmd_programs`` in both; results must be identical
for integer data and equal within floating-point tolerance for float data
(gloo adds in its own order, simdist in rank order).

Starting a real world costs far more than running the programs, so all programs
share one launch per layout and the comparison reports every differing program
at once.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import spmd_programs
import torch

import simdist
from simdist import Layout
from simdist.launch import run_processes

pytestmark = pytest.mark.gloo

SEED = 20240611
TIMEOUT_S = 90.0

# World size at most 4; non-power-of-two axes (3), every axis, and a flat world.
CASES: dict[str, dict[str, Any]] = {
    "flat4": {"world_size": 4},
    "tp2-dp2": {"layout": Layout(tp=2, dp=2)},
    "tp2-pp2": {"layout": Layout(tp=2, pp=2)},
    "cp2-pp2": {"layout": Layout(cp=2, pp=2)},
    "tp3": {"layout": Layout(tp=3)},
    "dp3": {"layout": Layout(dp=3)},
    "pp3": {"layout": Layout(pp=3)},
}
PROGRAM_NAMES = list(spmd_programs.PROGRAMS)


@functools.cache
def _gloo_results(case: str) -> list[dict[str, Any]]:
    return run_processes(
        spmd_programs.run_programs, args=(PROGRAM_NAMES, SEED), timeout=TIMEOUT_S, **CASES[case]
    )


def _simdist_results(case: str, reduction: str = "rank") -> list[dict[str, Any]]:
    return simdist.run(
        spmd_programs.run_programs,
        args=(PROGRAM_NAMES, SEED),
        timeout=TIMEOUT_S,
        reduction=reduction,
        **CASES[case],
    )


def differences(expected: Any, actual: Any, path: str) -> list[str]:
    """Every leaf where ``actual`` (simdist) differs from ``expected`` (gloo)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return [f"{path}: gloo gave a tensor, simdist gave {type(actual).__name__}"]
        if expected.dtype != actual.dtype or expected.shape != actual.shape:
            return [
                f"{path}: gloo gave {expected.dtype}{list(expected.shape)}, "
                f"simdist gave {actual.dtype}{list(actual.shape)}"
            ]
        if expected.is_floating_point():
            # assert_close's per-dtype defaults (e.g. bfloat16 rtol 1.6e-2):
            # room for a different summation order, not for a wrong result.
            try:
                torch.testing.assert_close(actual, expected, equal_nan=True)
            except AssertionError as exc:
                return [f"{path}: {exc}"]
            return []
        if not torch.equal(expected, actual):
            return [f"{path}: gloo {expected.tolist()} != simdist {actual.tolist()}"]
        return []
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(expected) != set(actual):
            got = sorted(actual) if isinstance(actual, dict) else type(actual).__name__
            return [f"{path}: gloo keys {sorted(expected)} != simdist {got}"]
        return [d for key in expected for d in differences(expected[key], actual[key], f"{path}/{key}")]
    if isinstance(expected, (list, tuple)):
        if type(expected) is not type(actual) or len(expected) != len(actual):
            return [f"{path}: gloo {expected!r} != simdist {actual!r}"]
        return [
            d for i, (e, a) in enumerate(zip(expected, actual)) for d in differences(e, a, f"{path}[{i}]")
        ]
    if expected != actual:
        return [f"{path}: gloo {expected!r} != simdist {actual!r}"]
    return []


def _assert_same(case: str, gloo: list[dict[str, Any]], sim: list[dict[str, Any]]) -> None:
    assert len(sim) == len(gloo)
    found = [
        d
        for rank in range(len(gloo))
        for name in PROGRAM_NAMES
        for d in differences(gloo[rank][name], sim[rank][name], f"rank {rank}: {name}")
    ]
    assert not found, f"{len(found)} differences on {case}:\n" + "\n".join(found[:40])


@pytest.mark.parametrize("case", list(CASES))
def test_simdist_matches_gloo(case: str) -> None:
    _assert_same(case, _gloo_results(case), _simdist_results(case))


@pytest.mark.parametrize("reduction", ["ring", "tree", "shuffled"])
@pytest.mark.parametrize("case", ["tp2-dp2", "pp3"])
def test_other_reduction_orders_match_gloo(case: str, reduction: str) -> None:
    """Another summation order moves float results within tolerance only; integers stay exact."""
    _assert_same(case, _gloo_results(case), _simdist_results(case, reduction))


@pytest.mark.parametrize("case", ["tp2-dp2", "pp3"])
def test_gloo_side_computes_the_reference(case: str) -> None:
    """The programs do real work: gloo's results agree with single-process maths.

    Guards the differential test against programs whose outputs are trivially
    equal (empty, or independent of the collective).
    """
    results = _gloo_results(case)
    layout = CASES[case]["layout"]
    world = list(range(layout.world_size))
    inputs = [spmd_programs.int_input(SEED, r, "ar-world-SUM", (5,), -3, 4) for r in world]
    for rank in world:
        assert torch.equal(results[rank]["all_reduce_int"]["world/SUM"], sum(inputs))
    products = [spmd_programs.int_input(SEED, r, "ar-world-PRODUCT", (5,), -2, 3) for r in world]
    expected_product = functools.reduce(torch.mul, products)
    assert torch.equal(results[0]["all_reduce_int"]["world/PRODUCT"], expected_product)
    # Every rank of the all_gather sees every rank's input, in group-rank order.
    mine = [spmd_programs.int_input(SEED, r, "ag-world", (3,), -100, 100) for r in world]
    assert torch.equal(results[-1]["all_gather_both"]["world/tensor"], torch.cat(mine))
    # Ring P2P: each stage holds what the previous stage sent.
    if layout.pp > 1:
        for rank in world:
            stage = layout.coords(rank).pp
            prev = layout.rank_of(pp=(stage - 1) % layout.pp)
            sent = spmd_programs.int_input(SEED, prev, "ring-batch", (5,), -100, 100)
            assert torch.equal(results[rank]["ring_exchange"]["batched"], sent)
