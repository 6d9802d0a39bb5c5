"""The soft cross-entropy target's emulated-CUDA cases (SoftCECase.cuda):
draft_loss's CUDA paths run in the default campaign, judged against float64
and bitwise against the same case on the CPU, and a bug only CUDA shows
fails them."""

from __future__ import annotations

from dataclasses import replace

import mutants
import pytest
from soft_ce_cases import SoftCECase, check_soft_ce, run_soft_ce_bad_input

CASE = SoftCECase(
    shards=(5, 7, 6),
    mask=((1.0, 1.0, 0.0, 1.0, 0.5), (0.0, 1.0, 1.0, 1.0, 1.0)),
    token_chunk_size=3,
    dtype="float32",
    bin_weights=(1.0, 0.5),
    single_bin=None,
    seed=11,
    reduction="rank",
    reduction_seed=0,
    teacher_neg_inf=True,
    overwrite=False,
    masked_nonfinite="nan",
    cuda=True,
)


def test_an_emulated_cuda_case_matches_float64_and_its_cpu_twin() -> None:
    check_soft_ce(CASE)
    check_soft_ce(replace(CASE, dtype="bfloat16", overwrite=True))


def test_a_bug_only_cuda_shows_fails_the_emulated_case_and_not_the_cpu_one() -> None:
    with mutants.applied("counts_on_the_host"):
        check_soft_ce(replace(CASE, cuda=False))
        with pytest.raises(AssertionError, match="Expected all tensors to be on the same device"):
            check_soft_ce(CASE)


@pytest.mark.parametrize("kind", ["mask_differs", "student_dtype_differs", "teacher_shape", "bins_differ"])
def test_bad_input_on_emulated_cuda_fails_on_every_tp_rank(kind: str) -> None:
    run_soft_ce_bad_input(replace(CASE, bad_input={"kind": kind, "rank": 1}))
