"""The corners of draft_loss's input space the default campaign must reach, and their floors.

Each corner is a predicate over a drawn case; every one must hold in at
least ``FLOOR`` of a strategy's draws (a corner the strategy cannot draw is
one no budget finds). ``tests/fuzz/test_drawability.py`` fails when a share
drops under its floor; ``benchmarks/drawability.py`` prints the table; the
campaign's coverage summary shows the same classes (``DraftCase.corners``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FLOOR = 0.05

Corner = Callable[[Any], bool]


def _clip(*classes: str) -> Corner:
    return lambda case: case.corners()["clip_vs_norm"] in classes


DRAFT_CORNERS: dict[str, Corner] = {
    **{
        f"{axis} >= 5": (lambda case, axis=axis: getattr(case, axis) >= 5)
        for axis in ("tp", "cp", "dp", "pp")
    },
    "float64": lambda case: case.dtype == "float64",
    "bfloat16": lambda case: case.dtype == "bfloat16",
    "3+ rows a microbatch": lambda case: case.corners()["rows"] == "3+",
    "rows not divisible by microbatches": lambda case: case.corners()["remainder"],
    "13-128 tokens a microbatch": lambda case: case.corners()["tokens"] == "13-128",
    "129-512 tokens a microbatch": lambda case: case.corners()["tokens"] == "129-512",
    "local vocab >= 10": lambda case: case.corners()["local_vocab"] == "10+",
    "uneven vocab shards": lambda case: case.corners()["uneven_vocab"],
    "a tile of 2+ row blocks": lambda case: case.corners()["multi_block_tile"],
    "clip below the norm": _clip("below", "below+above"),
    "clip at the norm": _clip("at"),
    "clip above the norm": _clip("above", "below+above"),
    "ring order": lambda case: case.reduction == "ring",
    "tree order": lambda case: case.reduction == "tree",
    "shuffled order": lambda case: case.reduction == "shuffled",
}

FAULT_CORNERS: dict[str, Corner] = {
    **DRAFT_CORNERS,
    "probe fault": lambda case: "probe" in case.fault,
    "probe fault in the optimizer": lambda case: ":optimizer:" in case.fault.get("probe", ""),
    "probe fault in a microbatch": lambda case: ":microbatch:" in case.fault.get("probe", ""),
    "fault in a monolithic step": lambda case: case.mode == "monolithic",
    **{
        f"{kind} fault": (lambda case, kind=kind: case.fault.get("kind") == kind)
        for kind in ("crash", "timeout", "abort", "delay")
    },
    "a step before the faulty one": lambda case: case.warmup,
}

# Bad input is refused before any maths: the corners of its shapes and layouts.
_COMPUTE_ONLY = (
    "a tile of 2+ row blocks",
    "clip below the norm",
    "clip at the norm",
    "clip above the norm",
    "ring order",
    "tree order",
    "shuffled order",
)
BAD_INPUT_CORNERS: dict[str, Corner] = {k: v for k, v in DRAFT_CORNERS.items() if k not in _COMPUTE_ONLY}

SOFT_CE_CORNERS: dict[str, Corner] = {
    "tp >= 5": lambda case: case.tp >= 5,
    **{
        dtype: (lambda case, dtype=dtype: case.dtype == dtype) for dtype in ("bfloat16", "float16", "float64")
    },
    "19-257 tokens": lambda case: case.corners()["tokens"] == "19-257",
    "258+ tokens": lambda case: case.corners()["tokens"] == "258+",
    "local vocab >= 10": lambda case: case.corners()["local_vocab"] == "10+",
    "uneven vocab shards": lambda case: len(set(case.shards)) > 1,
    "a tile of 2+ row blocks": lambda case: case.corners()["multi_block_tile"],
}

PROJECTED_CORNERS: dict[str, Corner] = {
    "tp >= 5": lambda case: case.base.tp >= 5,
    "float64": lambda case: case.base.dtype == "float64",
    "19-257 tokens": lambda case: case.base.corners()["tokens"] == "19-257",
    "local vocab >= 10": lambda case: case.base.corners()["local_vocab"] == "10+",
    "a tile of 2+ row blocks": lambda case: case.base.corners()["multi_block_tile"],
}


def targets() -> dict[str, tuple[Any, dict[str, Corner]]]:
    """``{name: (strategy, corners)}`` of every strategy of the default campaign."""
    from draft_cases import bad_input_cases, draft_cases, fault_cases
    from projected_cases import projected_cases
    from soft_ce_cases import soft_ce_bad_input_cases, soft_ce_cases

    return {
        "draft_cases": (draft_cases(), DRAFT_CORNERS),
        "fault_cases": (fault_cases(), FAULT_CORNERS),
        "bad_input_cases": (bad_input_cases(), BAD_INPUT_CORNERS),
        "soft_ce_cases": (soft_ce_cases(), SOFT_CE_CORNERS),
        "soft_ce_bad_input_cases": (soft_ce_bad_input_cases(), SOFT_CE_CORNERS),
        "projected_cases": (projected_cases(), PROJECTED_CORNERS),
    }


def draws(strategy: Any, examples: int, seeds: range) -> list[Any]:
    """Cases as a campaign round draws them: generation only, random seeds (fixed here)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    out: list[Any] = []
    for run_seed in seeds:
        # On Hypothesis' own default profile, whatever the suite loaded: a
        # derandomized profile would ignore the seed and draw one sample twice.
        @seed(run_seed)
        @settings(
            settings.get_profile("default"),
            derandomize=False,
            max_examples=examples,
            database=None,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def draw(case: Any) -> None:
            out.append(case)

        draw()
    return out


def shares(cases: list[Any], corners: dict[str, Corner]) -> dict[str, float]:
    return {
        name: sum(1 for case in cases if corner(case)) / max(1, len(cases))
        for name, corner in corners.items()
    }
