"""Bad input to the draft losses: each gets a specific ValueError/TypeError naming
the argument and what came. (The TP variants, where one rank alone is wrong,
are in test_soft_ce_tp.py.)"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from draft_loss import DraftLossStats, align_for_draft, projected_soft_cross_entropy, soft_cross_entropy

T, V, H = 4, 6, 3
META = torch.device("meta")  # a second device that exists on every machine


def good_soft_ce() -> dict[str, Any]:
    return dict(
        student_logits=torch.randn(2, 2, V),
        teacher_logits=torch.randn(2, 2, V),
        mask=torch.ones(2, 2, dtype=torch.bool),
        tp_group=None,
        token_chunk_size=2,
        bin_ids=torch.tensor([[0, 1], [1, 0]]),
        weights=torch.tensor([1.0, 2.0]),
    )


def call_soft_ce(**changes: Any) -> Callable[[], object]:
    arguments = good_soft_ce()
    arguments.update(changes)
    student, teacher, mask = (
        arguments.pop("student_logits"),
        arguments.pop("teacher_logits"),
        arguments.pop("mask"),
    )
    return lambda: soft_cross_entropy(student, teacher, mask, **arguments)


SOFT_CE_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "student-not-tensor",
        dict(student_logits=[[1.0]]),
        TypeError,
        r"student_logits must be a torch.Tensor, got list",
    ),
    (
        "student-int",
        dict(student_logits=torch.ones(2, 2, V, dtype=torch.int64)),
        TypeError,
        r"student_logits must be float16.*got dtype torch.int64",
    ),
    (
        "student-complex",
        dict(student_logits=torch.ones(2, 2, V, dtype=torch.complex64)),
        TypeError,
        r"student_logits .*got dtype torch.complex64",
    ),
    (
        "student-0d",
        dict(student_logits=torch.tensor(1.0)),
        ValueError,
        r"student_logits must have at least 1 dim.*got shape \(\)",
    ),
    (
        "teacher-int",
        dict(teacher_logits=torch.ones(2, 2, V, dtype=torch.int32)),
        TypeError,
        r"teacher_logits must be float16.*got dtype torch.int32",
    ),
    (
        "teacher-shape",
        dict(teacher_logits=torch.randn(2, 2, V + 1)),
        ValueError,
        r"teacher_logits must have the shape of student_logits \(2, 2, 6\), got \(2, 2, 7\)",
    ),
    (
        "empty-vocab",
        dict(student_logits=torch.randn(2, 2, 0), teacher_logits=torch.randn(2, 2, 0)),
        ValueError,
        r"the vocabulary shard \(last dim of the logits\) must be >= 1, got 0",
    ),
    (
        "teacher-device",
        dict(teacher_logits=torch.randn(2, 2, V, device=META)),
        ValueError,
        r"teacher_logits must be on the same device as student_logits \(cpu\), got meta",
    ),
    ("chunk-zero", dict(token_chunk_size=0), ValueError, r"token_chunk_size must be >= 1, got 0"),
    ("chunk-negative", dict(token_chunk_size=-3), ValueError, r"token_chunk_size must be >= 1, got -3"),
    ("chunk-float", dict(token_chunk_size=2.0), TypeError, r"token_chunk_size must be an int, got float"),
    ("chunk-bool", dict(token_chunk_size=True), TypeError, r"token_chunk_size must be an int, got bool"),
    ("chunk-none", dict(token_chunk_size=None), TypeError, r"token_chunk_size must be an int, got NoneType"),
    ("mask-not-tensor", dict(mask=[[1, 1], [1, 1]]), TypeError, r"mask must be a torch.Tensor, got list"),
    (
        "mask-complex",
        dict(mask=torch.ones(2, 2, dtype=torch.complex64)),
        TypeError,
        r"mask must be bool, integer or real floating, got dtype torch.complex64",
    ),
    (
        "mask-shape",
        dict(mask=torch.ones(2, 3)),
        ValueError,
        r"mask must have the logits' leading shape \(2, 2\), got \(2, 3\)",
    ),
    (
        "mask-flat",
        dict(mask=torch.ones(4)),
        ValueError,
        r"mask must have the logits' leading shape \(2, 2\), got \(4,\)",
    ),
    (
        "mask-negative",
        dict(mask=torch.tensor([[1.0, -1.0], [1.0, 1.0]])),
        ValueError,
        r"mask values must be finite and >= 0, got e.g. \[-1.0\]",
    ),
    (
        "mask-nan",
        dict(mask=torch.tensor([[1.0, math.nan], [1.0, 1.0]])),
        ValueError,
        r"mask values must be finite and >= 0, got e.g. \[nan\]",
    ),
    (
        "mask-int-negative",
        dict(mask=torch.tensor([[1, -2], [1, 1]])),
        ValueError,
        r"mask values must be finite and >= 0, got e.g. \[-2.0\]",
    ),
    (
        "mask-device",
        dict(mask=torch.ones(2, 2, device=META)),
        ValueError,
        r"mask must be on the same device as student_logits \(cpu\), got meta",
    ),
    (
        "bins-not-tensor",
        dict(bin_ids=[[0, 1], [1, 0]]),
        TypeError,
        r"bin_ids must be a torch.Tensor or None, got list",
    ),
    (
        "bins-float",
        dict(bin_ids=torch.zeros(2, 2)),
        TypeError,
        r"bin_ids must be an integer tensor, got dtype torch.float32",
    ),
    (
        "bins-bool",
        dict(bin_ids=torch.zeros(2, 2, dtype=torch.bool)),
        TypeError,
        r"bin_ids must be an integer tensor, got dtype torch.bool",
    ),
    (
        "bins-shape",
        dict(bin_ids=torch.zeros(4, dtype=torch.int64)),
        ValueError,
        r"bin_ids must have the logits' leading shape \(2, 2\), got \(4,\)",
    ),
    (
        "bins-negative",
        dict(bin_ids=torch.tensor([[0, -1], [1, 0]])),
        ValueError,
        r"bin_ids must be >= 0, got minimum -1",
    ),
    (
        "bins-too-large",
        dict(bin_ids=torch.tensor([[0, 2], [1, 0]])),
        ValueError,
        r"bin_ids must be < len\(weights\) = 2, got maximum 2",
    ),
    (
        "bins-device",
        dict(bin_ids=torch.zeros(2, 2, dtype=torch.int64, device=META)),
        ValueError,
        r"bin_ids must be on the same device as student_logits \(cpu\), got meta",
    ),
    (
        "weights-not-tensor",
        dict(weights=[1.0, 2.0]),
        TypeError,
        r"weights must be a torch.Tensor or None, got list",
    ),
    (
        "weights-int",
        dict(weights=torch.tensor([1, 2])),
        TypeError,
        r"weights must be a floating tensor, got dtype torch.int64",
    ),
    (
        "weights-2d",
        dict(weights=torch.ones(2, 1)),
        ValueError,
        r"weights must be 1-D with one entry per bin \(>= 1\), got shape \(2, 1\)",
    ),
    (
        "weights-empty",
        dict(weights=torch.ones(0), bin_ids=None),
        ValueError,
        r"weights must be 1-D .* got shape \(0,\)",
    ),
    (
        "weights-negative",
        dict(weights=torch.tensor([1.0, -0.5])),
        ValueError,
        r"weights must be finite and >= 0, got e.g. \[-0.5\] \(of 2 weights\)",
    ),
    (
        "weights-inf",
        dict(weights=torch.tensor([1.0, math.inf])),
        ValueError,
        r"weights must be finite and >= 0, got e.g. \[inf\] \(of 2 weights\)",
    ),
    (
        "weights-device",
        dict(weights=torch.ones(2, device=META)),
        ValueError,
        r"weights must be on the same device as student_logits \(cpu\), got meta",
    ),
    (
        "tp-group-not-a-group",
        dict(tp_group="tp"),
        TypeError,
        r"tp_group must be a torch.distributed ProcessGroup or None, got str",
    ),
]


@pytest.mark.parametrize(
    ("changes", "error", "pattern"), [c[1:] for c in SOFT_CE_CASES], ids=[c[0] for c in SOFT_CE_CASES]
)
def test_soft_cross_entropy_rejects(changes: dict[str, Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=r"^soft_cross_entropy: " + pattern):
        call_soft_ce(**changes)()


def test_the_good_arguments_of_these_tests_are_accepted() -> None:
    # Guards the table above: each case differs from a call that works.
    stats = call_soft_ce()()
    assert isinstance(stats, DraftLossStats) and stats.num_bins == 2


def call_projected(**changes: Any) -> Callable[[], object]:
    arguments: dict[str, Any] = dict(
        student_hidden=torch.randn(T, H),
        output_weight=torch.randn(V, H),
        teacher_logits=torch.randn(T, V),
        mask=torch.ones(T),
        tp_group=None,
        token_chunk_size=2,
    )
    arguments.update(changes)
    positional = [
        arguments.pop(name) for name in ("student_hidden", "output_weight", "teacher_logits", "mask")
    ]
    return lambda: projected_soft_cross_entropy(*positional, **arguments)


PROJECTED_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "hidden-int",
        dict(student_hidden=torch.ones(T, H, dtype=torch.int64)),
        TypeError,
        r"student_hidden must be float16.*got dtype torch.int64",
    ),
    (
        "weight-not-tensor",
        dict(output_weight=None),
        TypeError,
        r"output_weight must be a torch.Tensor, got NoneType",
    ),
    (
        "weight-1d",
        dict(output_weight=torch.randn(V)),
        ValueError,
        r"output_weight must have at least 2 dim\(s\), got shape \(6,\)",
    ),
    (
        "weight-3d",
        dict(output_weight=torch.randn(V, H, 1)),
        ValueError,
        r"output_weight must be 2-D \[V_local, H\], got shape \(6, 3, 1\)",
    ),
    (
        "weight-dtype",
        dict(output_weight=torch.randn(V, H, dtype=torch.float64)),
        TypeError,
        r"output_weight must have the dtype of student_hidden \(torch.float32\), got torch.float64",
    ),
    (
        "weight-hidden-size",
        dict(output_weight=torch.randn(V, H + 1)),
        ValueError,
        r"output_weight must be \[V_local, 3\] \(H of student_hidden\), got shape \(6, 4\)",
    ),
    (
        "weight-no-rows",
        dict(output_weight=torch.randn(0, H), teacher_logits=torch.randn(T, 0)),
        ValueError,
        r"the vocabulary shard \(rows of output_weight\) must be >= 1, got 0",
    ),
    (
        "teacher-shape",
        dict(teacher_logits=torch.randn(T, V - 1)),
        ValueError,
        r"teacher_logits must have shape \(4, 6\) \(hidden's leading dims, V_local\), got \(4, 5\)",
    ),
    (
        "weight-device",
        dict(output_weight=torch.randn(V, H, device=META)),
        ValueError,
        r"output_weight must be on the same device as student_hidden \(cpu\), got meta",
    ),
    (
        "mask-shape",
        dict(mask=torch.ones(T + 1)),
        ValueError,
        r"mask must have the logits' leading shape \(4,\), got \(5,\)",
    ),
    ("chunk-zero", dict(token_chunk_size=0), ValueError, r"token_chunk_size must be >= 1, got 0"),
]


@pytest.mark.parametrize(
    ("changes", "error", "pattern"), [c[1:] for c in PROJECTED_CASES], ids=[c[0] for c in PROJECTED_CASES]
)
def test_projected_soft_cross_entropy_rejects(
    changes: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=r"^projected_soft_cross_entropy: " + pattern):
        call_projected(**changes)()


def test_projected_good_arguments_are_accepted() -> None:
    assert isinstance(call_projected()(), DraftLossStats)


@pytest.mark.parametrize(
    ("teacher", "mask", "error", "pattern"),
    [
        (
            torch.randn(2, 3),
            torch.ones(2, 3),
            ValueError,
            r"teacher_logits must be \[batch, seq, V_local\], got shape \(2, 3\)",
        ),
        (
            torch.randn(2, 3, 4),
            torch.ones(2, 4),
            ValueError,
            r"token_mask must be \[batch, seq\] = \(2, 3\), got \(2, 4\)",
        ),
        (torch.randn(2, 3, 4), [[1, 1, 1]], TypeError, r"token_mask must be a torch.Tensor, got list"),
        (
            torch.randn(2, 3, 4),
            torch.ones(2, 3, dtype=torch.complex64),
            TypeError,
            r"token_mask must be bool, integer or real floating, got dtype torch.complex64",
        ),
        (
            torch.ones(2, 3, 4, dtype=torch.int64),
            torch.ones(2, 3),
            TypeError,
            r"teacher_logits must be float16.*got dtype torch.int64",
        ),
        (
            torch.randn(2, 3, 4),
            torch.ones(2, 3, device=META),
            ValueError,
            r"token_mask must be on the same device as teacher_logits \(cpu\), got meta",
        ),
    ],
)
def test_align_for_draft_rejects(teacher: Any, mask: Any, error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=r"^align_for_draft: " + pattern):
        align_for_draft(teacher, mask)


def _stats_fields(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(numerators=torch.ones(2), counts=torch.ones(2), weights=torch.ones(2))
    fields.update(changes)
    return fields


STATS_CASES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "numerators-not-tensor",
        _stats_fields(numerators=[1.0, 2.0]),
        TypeError,
        r"numerators must be a torch.Tensor, got list",
    ),
    (
        "counts-float16",
        _stats_fields(counts=torch.ones(2, dtype=torch.float16)),
        TypeError,
        r"counts must be float32 \(or float64\), got dtype torch.float16",
    ),
    (
        "weights-2d",
        _stats_fields(weights=torch.ones(2, 1)),
        ValueError,
        r"weights must be 1-D \(one entry per bin\), got shape \(2, 1\)",
    ),
    (
        "lengths",
        _stats_fields(counts=torch.ones(3)),
        ValueError,
        r"numerators, counts and weights must have one length, got \{'numerators': 2, 'counts': 3, 'weights': 2\}",
    ),
    (
        "empty",
        _stats_fields(numerators=torch.ones(0), counts=torch.ones(0), weights=torch.ones(0)),
        ValueError,
        r"need at least one bin, got length 0",
    ),
    (
        "mixed-dtypes",
        _stats_fields(counts=torch.ones(2, dtype=torch.float64)),
        TypeError,
        r"numerators, counts and weights must share one dtype, got torch.float32, torch.float64, torch.float32",
    ),
    (
        "devices",
        _stats_fields(weights=torch.ones(2, device=META)),
        ValueError,
        r"numerators, counts and weights must be on one device, got cpu, cpu, meta",
    ),
    (
        "counts-grad",
        _stats_fields(counts=torch.ones(2, requires_grad=True)),
        ValueError,
        r"counts must not require grad",
    ),
    (
        "counts-negative",
        _stats_fields(counts=torch.tensor([1.0, -1.0])),
        ValueError,
        r"counts must be finite and non-negative, got \[1.0, -1.0\]",
    ),
    (
        "weights-nan",
        _stats_fields(weights=torch.tensor([1.0, math.nan])),
        ValueError,
        r"weights must be finite and non-negative, got \[1.0, nan\]",
    ),
]


@pytest.mark.parametrize(
    "fields, error, pattern", [c[1:] for c in STATS_CASES], ids=[c[0] for c in STATS_CASES]
)
def test_draft_loss_stats_rejects(fields: dict[str, Any], error: type[Exception], pattern: str) -> None:
    with pytest.raises(error, match=r"^DraftLossStats: " + pattern):
        DraftLossStats(**fields)


@pytest.mark.parametrize(
    ("counts", "error", "pattern"),
    [
        ([1.0, 1.0], TypeError, r"normalization_counts must be a torch.Tensor, got list"),
        (
            torch.ones(3),
            ValueError,
            r"normalization_counts must have shape \(2,\) \(one per bin\), got \(3,\)",
        ),
        (
            torch.ones(2, dtype=torch.bool),
            TypeError,
            r"normalization_counts must be real numbers, got dtype torch.bool",
        ),
        (torch.ones(2, device=META), ValueError, r"normalization_counts must be on cpu, got meta"),
    ],
)
def test_normalized_rejects(counts: Any, error: type[Exception], pattern: str) -> None:
    stats = DraftLossStats(**_stats_fields())
    with pytest.raises(error, match=r"^normalized: " + pattern):
        stats.normalized(counts)


def test_non_finite_numerators_are_accepted_because_they_report_non_finite_logits() -> None:
    stats = DraftLossStats(torch.tensor([math.nan, 1.0]), torch.ones(2), torch.ones(2))
    assert math.isnan(stats.normalized().item())


def test_every_message_names_its_argument() -> None:
    # The argument named in each case id appears in the message (a cheap guard
    # against a copy-pasted message naming the wrong argument).
    for case_id, changes, _, _ in SOFT_CE_CASES:
        with pytest.raises((ValueError, TypeError)) as info:
            call_soft_ce(**changes)()
        names = {
            "student": "student_logits",
            "teacher": "teacher_logits",
            "empty": "vocabulary",
            "chunk": "token_chunk_size",
            "mask": "mask",
            "bins": "bin_ids",
            "weights": "weights",
            "tp": "tp_group",
        }
        expected = names[case_id.split("-")[0]]
        assert re.search(re.escape(expected), str(info.value)), (case_id, str(info.value))


def _imports_of_draft_loss() -> dict[str, list[str]]:
    """Absolute module names each draft_loss source file imports, keyed by its path in the package."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "draft_loss"
    found: dict[str, list[str]] = {}
    for source in sorted(package.rglob("*.py")):
        relative = source.relative_to(package.parent)
        here = list(relative.with_suffix("").parts)
        if here[-1] == "__init__":
            here.pop()
        names: list[str] = []
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolved against this module's package
                    base = here[: len(here) - node.level + (1 if source.name == "__init__.py" else 0)]
                    prefix = ".".join(base)
                    module = f"{prefix}.{node.module}" if node.module else prefix
                    names += [module] + [f"{module}.{alias.name}" for alias in node.names]
                else:
                    names.append(node.module or "")
        found[relative.as_posix()] = names
    return found


def test_draft_loss_never_imports_simdist() -> None:
    # draft_loss is the code under test: it must speak only torch.distributed.
    found = _imports_of_draft_loss()
    assert any(path.startswith("draft_loss/cotrain/") for path in found), sorted(found)  # subpackages scanned
    for path, names in found.items():
        assert not any(name.split(".")[0] == "simdist" for name in names), f"{path} imports {names}"


def test_the_loss_api_never_imports_the_reference_model() -> None:
    # Imports point one way: draft_loss.cotrain uses the loss, the loss never the model.
    for path, names in _imports_of_draft_loss().items():
        if path.startswith("draft_loss/cotrain/"):
            continue
        model = [
            name for name in names if name == "draft_loss.cotrain" or name.startswith("draft_loss.cotrain.")
        ]
        assert not model, f"{path} imports the reference model: {model}"


def test_public_names_resolve_and_the_model_stays_out_of_the_loss_api() -> None:
    import draft_loss
    import draft_loss.cotrain

    for package in (draft_loss, draft_loss.cotrain):
        missing = [name for name in package.__all__ if not hasattr(package, name)]
        assert not missing, f"{package.__name__}.__all__ names what it does not define: {missing}"
        assert len(set(package.__all__)) == len(package.__all__), package.__all__
    assert not set(draft_loss.__all__) & set(draft_loss.cotrain.__all__)
    assert not [name for name in draft_loss.__all__ if "cotrain" in name.lower()]
