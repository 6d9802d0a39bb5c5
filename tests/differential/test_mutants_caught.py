"""Every planted simdist bug of ``simdist_mutants`` is caught by the differential check.

For each mutant one small program (shrunk by a campaign, or written to hit
the bug directly) passes the differential check on the real simdist and fails
it with the mutant applied: the check can see that bug. The campaign's time
to find each one from scratch is ``benchmarks/diff_mutants.py``'s job.
"""

from __future__ import annotations

import pytest
import simdist_mutants
from diff_program import Program
from test_differential_property import check_program

pytestmark = pytest.mark.gloo


def _p(world: int, *steps: dict) -> Program:
    return Program.from_json({"world": world, "seed": 3, "steps": list(steps)})


CATCHING: dict[str, Program] = {
    "max_as_min": _p(2, {"op": "all_reduce", "dtype": "int64", "red": "MAX"}),
    "product_as_sum": _p(3, {"op": "all_reduce", "dtype": "int64", "red": "PRODUCT"}),
    "avg_not_divided": _p(2, {"op": "all_reduce", "red": "AVG"}),
    "bxor_as_bor": _p(2, {"op": "all_reduce", "dtype": "int64", "red": "BXOR", "shape": [8]}),
    # Rank 0 waits in the recv while ranks 1 and 2 reach the all_gather first.
    "results_in_arrival_order": _p(
        3, {"op": "send_recv", "root": 2, "peer": 0}, {"op": "all_gather", "dtype": "int64"}
    ),
    "reduce_scatter_chunk_by_global_rank": _p(
        3, {"op": "reduce_scatter_tensor", "dtype": "int64", "group": [1, 2]}
    ),
    "all_gather_slot_by_global_rank": _p(
        3, {"op": "all_gather_into_tensor", "dtype": "int64", "group": [1, 2]}
    ),
    "broadcast_root_as_global_rank": _p(3, {"op": "broadcast", "dtype": "int64", "group": [1, 2]}),
    "scatter_root_as_global_rank": _p(3, {"op": "scatter", "dtype": "int64", "group": [1, 2]}),
    "p2p_peer_as_global_rank": _p(3, {"op": "send_recv", "group": [1, 2], "root": 0, "peer": 1}),
    "all_to_all_single_output_offsets_from_input": _p(
        3, {"op": "all_to_all_single", "dtype": "int64", "uneven": True, "shape": [2]}
    ),
    "reduce_into_ignores_aliasing": _p(2, {"op": "reduce_scatter", "dtype": "int64", "inplace": True}),
    "strided_outputs_written_to_a_copy": _p(2, {"op": "all_gather", "dtype": "int64", "view": "strided"}),
    "all_reduce_bumps_version": _p(2, {"op": "all_reduce"}),
}


def test_every_mutant_has_a_catching_program() -> None:
    assert sorted(CATCHING) == sorted(simdist_mutants.MUTANTS)
    assert set(simdist_mutants.FAMILIES.values()) >= {
        "reduce ops",
        "ordering",
        "group vs global rank",
        "p2p",
        "all_to_all",
        "aliasing",
        "views",
        "version counters",
    }


@pytest.mark.parametrize("name", sorted(CATCHING))
def test_mutant_is_caught(name: str) -> None:
    program = CATCHING[name]
    check_program(program)  # the real simdist agrees with gloo on it
    with simdist_mutants.applied(name), pytest.raises(AssertionError, match="new difference"):
        check_program(program)


def test_a_moved_target_is_named_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(simdist_mutants.TARGETS, "reduce_into", "simdist._backend.kernels:no_such_function")
    with pytest.raises(simdist_mutants.MutantTargetError, match=r"TARGETS\['reduce_into'\]"):
        simdist_mutants.apply("reduce_into_ignores_aliasing")
    monkeypatch.setitem(simdist_mutants.TARGETS, "reduce_into", "simdist._no_such_module:reduce_into")
    with pytest.raises(simdist_mutants.MutantTargetError, match="cannot be imported"):
        simdist_mutants.apply("reduce_into_ignores_aliasing")


def test_every_target_resolves() -> None:
    for key in simdist_mutants.TARGETS:
        simdist_mutants.resolve(key)
