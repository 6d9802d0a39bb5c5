"""Golden values (fixtures/soft_ce_golden.json, float64, made from the reference
implementation) pin the numbers of every path against silent drift."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from soft_ce_reference import reference_stats

from draft_loss import projected_soft_cross_entropy, soft_cross_entropy

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GOLDEN = json.loads((FIXTURES / "soft_ce_golden.json").read_text())
CASES = {case["name"]: case for case in GOLDEN["cases"]}
SOFT = [name for name, case in CASES.items() if case["kind"] == "soft"]


def tensor(values: Any, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def soft_inputs(case: dict[str, Any]) -> dict[str, Any]:
    inputs = case["inputs"]
    return dict(
        student=tensor(inputs["student_logits"]),
        teacher=tensor(inputs["teacher_logits"]),
        mask=tensor(inputs["mask"], getattr(torch, inputs["mask_dtype"])),
        bin_ids=None if inputs["bin_ids"] is None else tensor(inputs["bin_ids"], torch.int64),
        weights=None if inputs["weights"] is None else tensor(inputs["weights"]),
        upstream=tensor(inputs["upstream"]),
    )


def test_fixture_covers_the_paths_it_should() -> None:
    assert {
        "single-bin-bool-mask",
        "bins-weights-float-mask",
        "all-zero-mask",
        "large-logits",
        "projected",
    } <= set(CASES)


@pytest.mark.parametrize("chunk", [1, 2, 1000], ids=["chunk1", "chunk2", "cached"])
@pytest.mark.parametrize("name", SOFT)
def test_soft_cross_entropy_reproduces_golden_values(name: str, chunk: int) -> None:
    inputs = soft_inputs(CASES[name])
    expected = CASES[name]["expected"]
    student = inputs["student"].clone().requires_grad_(True)
    stats = soft_cross_entropy(
        student,
        inputs["teacher"],
        inputs["mask"],
        tp_group=None,
        token_chunk_size=chunk,
        bin_ids=inputs["bin_ids"],
        weights=inputs["weights"],
    )
    torch.testing.assert_close(stats.numerators, tensor(expected["numerators"]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stats.counts, tensor(expected["counts"]), rtol=0, atol=0)
    torch.testing.assert_close(stats.weights, tensor(expected["weights"]), rtol=0, atol=0)
    normalized = stats.normalized()
    assert normalized.item() == pytest.approx(expected["normalized"], rel=1e-12, abs=1e-12)
    (inputs["upstream"] * stats.numerators).sum().backward()
    torch.testing.assert_close(student.grad, tensor(expected["student_gradient"]), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", SOFT)
def test_float32_path_stays_near_golden_values(name: str) -> None:
    inputs = soft_inputs(CASES[name])
    expected = CASES[name]["expected"]
    stats = soft_cross_entropy(
        inputs["student"].float(),
        inputs["teacher"].float(),
        inputs["mask"],
        tp_group=None,
        token_chunk_size=2,
        bin_ids=inputs["bin_ids"],
        weights=None if inputs["weights"] is None else inputs["weights"].float(),
    )
    # Logits up to ~200 in "large-logits": float32 keeps about 1e-5 of them.
    torch.testing.assert_close(
        stats.numerators.double(), tensor(expected["numerators"]), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize("chunk", [2, 1000], ids=["streaming", "cached"])
def test_projected_reproduces_golden_values(chunk: int) -> None:
    case = CASES["projected"]
    inputs, expected = case["inputs"], case["expected"]
    hidden = tensor(inputs["student_hidden"]).requires_grad_(True)
    weight = tensor(inputs["output_weight"]).requires_grad_(True)
    stats = projected_soft_cross_entropy(
        hidden,
        weight,
        tensor(inputs["teacher_logits"]),
        tensor(inputs["mask"], torch.bool),
        tp_group=None,
        token_chunk_size=chunk,
        bin_ids=tensor(inputs["bin_ids"], torch.int64),
    )
    torch.testing.assert_close(stats.numerators, tensor(expected["numerators"]), rtol=1e-12, atol=1e-12)
    (tensor(inputs["upstream"]) * stats.numerators).sum().backward()
    torch.testing.assert_close(hidden.grad, tensor(expected["hidden_gradient"]), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(weight.grad, tensor(expected["weight_gradient"]), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("name", SOFT)
def test_reference_still_produces_the_goldens(name: str) -> None:
    # If this fails, the reference changed: the goldens were made from it.
    inputs = soft_inputs(CASES[name])
    ref = reference_stats(
        inputs["student"], inputs["teacher"], inputs["mask"], inputs["bin_ids"], inputs["weights"]
    )
    torch.testing.assert_close(
        ref.numerators, tensor(CASES[name]["expected"]["numerators"]), rtol=1e-13, atol=1e-13
    )


def test_generator_script_still_reproduces_the_fixture() -> None:
    spec = importlib.util.spec_from_file_location("make_soft_ce_golden", FIXTURES / "make_soft_ce_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    regenerated = json.loads(module.render(module.build()))
    assert [case["name"] for case in regenerated["cases"]] == list(CASES)
    for case in regenerated["cases"]:
        golden = CASES[case["name"]]
        if case["inputs"] != golden["inputs"]:
            continue  # torch's generator changed: the stored inputs stay authoritative
        for key, values in case["expected"].items():
            torch.testing.assert_close(
                tensor(values), tensor(golden["expected"][key]), rtol=1e-12, atol=1e-13
            )
