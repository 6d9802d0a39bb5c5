"""The draft loss's state across one split (gradient-accumulation) step.

The draft loss cannot be normalised per microbatch: its denominator is the
DP-global, whole-step weighted token count ``d = sum_b w_b C_b``. So each
microbatch backpropagates the *raw* weighted numerators and hands its detached
statistics to a ``DraftStepState``. After the last microbatch the state's local
counts ride the policy's own DP count all-reduce (no extra collective), the
reduced counts are recorded, and the draft gradients, which the policy has
normalised by its count ``n`` like every other gradient, are re-denominated
by ``n / d``.

Lifecycle (anything else raises ``StepOrderError``)::

    IDLE --begin_step--> ACCUMULATING --record_global_counts--> REDUCED
         --correct_main_grads--> CORRECTED --finish--> IDLE
    abort(): any phase --> IDLE, every accumulation dropped.

Under context parallelism "DP-global" means summed over DP x CP: each CP
rank holds other tokens of the same sequences, the gradients are SUMMED over
DP x CP, and every token is divided by the same global counts, so the factor
stays ``n / d`` (no CP factor; one would be needed only for gradients
averaged over CP, as Megatron's DDP does).

An IDLE state is "inactive": it contributes an empty tensor to the count
all-reduce and its correction is a no-op, so pipeline stages without a draft
head run the same code and the same collectives.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .grads import (
    GradientOrderError,
    main_grad,
    main_grad_denominator,
    parameter_group,
    set_main_grad_denominator,
)

if TYPE_CHECKING:
    from .stats import DraftLossStats

__all__ = ["DraftMetrics", "DraftStepState", "StepOrderError", "StepPhase"]

# Accumulations and the reduction payload are float64: counts stay exact far
# beyond float32's 2**24, and summing microbatch numerators loses nothing that
# the monolithic path would keep.
_ACC_DTYPE = torch.float64


class StepPhase(enum.Enum):
    IDLE = "idle"
    ACCUMULATING = "accumulating"
    REDUCED = "reduced"
    CORRECTED = "corrected"


class StepOrderError(RuntimeError):
    """A step-state method was called in a phase that does not allow it."""


@dataclass(frozen=True)
class DraftMetrics:
    """DP-global draft metrics of one step, identical on every DP rank."""

    loss: float  # sum_b w_b num_b / sum_b w_b C_b, 0 when the weighted count is 0
    weighted_count: float  # sum_b w_b C_b, the draft gradients' denominator
    token_count: float  # sum_b C_b
    counts: torch.Tensor  # per-bin DP-global counts (float64)
    numerators: torch.Tensor  # per-bin DP-global numerators (float64)


class DraftStepState:
    """Accumulates a split step's draft statistics and re-denominates draft gradients."""

    _phase: StepPhase
    _num_microbatches: int
    _weights: torch.Tensor | None
    _numerators: torch.Tensor | None
    _counts: torch.Tensor | None
    _global_counts: torch.Tensor | None
    _global_numerators: torch.Tensor | None

    def __init__(self) -> None:
        self._reset()

    # ------------------------------------------------------------ inspection

    @property
    def phase(self) -> StepPhase:
        return self._phase

    @property
    def active(self) -> bool:
        """True between ``begin_step`` and ``finish``/``abort``."""
        return self._phase is not StepPhase.IDLE

    @property
    def num_microbatches(self) -> int:
        """Microbatches accumulated in the current step."""
        return self._num_microbatches

    @property
    def num_bins(self) -> int | None:
        """Bins fixed by the step's first microbatch (None before it)."""
        return None if self._weights is None else int(self._weights.shape[0])

    # ------------------------------------------------------------- lifecycle

    def begin_step(self) -> None:
        if self._phase is not StepPhase.IDLE:
            raise StepOrderError(
                f"begin_step: a step is already in progress (phase {self._phase.value}); "
                "call finish() or abort() before beginning another"
            )
        self._phase = StepPhase.ACCUMULATING

    def accumulate(self, stats: DraftLossStats) -> None:
        """Adds one microbatch's detached local statistics to the step's sums."""
        self._require(StepPhase.ACCUMULATING, "accumulate")
        numerators, counts, weights = _fields_of(stats)
        for name, value in (("numerators", numerators), ("counts", counts), ("weights", weights)):
            if value.requires_grad or value.grad_fn is not None:
                raise ValueError(
                    f"accumulate: stats.{name} still carries autograd history; pass stats.detach() "
                    "(keeping it would hold every microbatch's graph alive until the step ends)"
                )
        if self._weights is None:
            self._weights = weights.to(_ACC_DTYPE).clone()
            self._numerators = torch.zeros_like(self._weights)
            self._counts = torch.zeros_like(self._weights)
        else:
            if tuple(weights.shape) != tuple(self._weights.shape):
                raise ValueError(
                    f"accumulate: this step's microbatches have {self._weights.shape[0]} bins, "
                    f"microbatch {self._num_microbatches} has {weights.shape[0]}"
                )
            if weights.device != self._weights.device:
                raise ValueError(
                    f"accumulate: this step's statistics live on {self._weights.device}, "
                    f"microbatch {self._num_microbatches} brought {weights.device}"
                )
            if not torch.equal(weights.to(_ACC_DTYPE), self._weights):
                raise ValueError(
                    f"accumulate: bin weights changed within a step: first microbatch had "
                    f"{self._weights.tolist()}, microbatch {self._num_microbatches} has "
                    f"{weights.tolist()}; one step has one set of weights"
                )
        assert self._numerators is not None and self._counts is not None
        self._numerators += numerators.to(_ACC_DTYPE)
        self._counts += counts.to(_ACC_DTYPE)
        self._num_microbatches += 1

    def contribute_counts(self) -> torch.Tensor:
        """This rank's share of the DP count all-reduce: ``[counts..., numerators...]``.

        Concatenate it to the policy's own count payload and all-reduce (SUM)
        once; the numerators ride along so the DP-global loss metric needs no
        collective of its own. An inactive state contributes an empty tensor.
        """
        if self._phase is StepPhase.IDLE:
            return torch.zeros(0, dtype=_ACC_DTYPE)
        self._require(StepPhase.ACCUMULATING, "contribute_counts")
        if self._weights is None:
            raise StepOrderError(
                "contribute_counts: no microbatch was accumulated in this step, so the number of "
                "bins (the payload's size, which every DP rank must agree on) is unknown"
            )
        assert self._counts is not None and self._numerators is not None
        return torch.cat([self._counts, self._numerators])

    def record_global_counts(self, reduced: torch.Tensor) -> None:
        """Records the DP-global sums of ``contribute_counts()`` (counts, then numerators)."""
        if self._phase is StepPhase.IDLE:
            if not isinstance(reduced, torch.Tensor) or reduced.numel() != 0:
                raise StepOrderError(
                    "record_global_counts: this state is inactive (no step begun) and contributed an "
                    f"empty payload, but got {_describe(reduced)} back"
                )
            return
        self._require(StepPhase.ACCUMULATING, "record_global_counts")
        if self._weights is None:
            raise StepOrderError(
                "record_global_counts: no microbatch was accumulated in this step, so there are no "
                "counts to record (accumulate at least one microbatch, or abort() the step)"
            )
        bins = int(self._weights.shape[0])
        if not isinstance(reduced, torch.Tensor) or reduced.dim() != 1 or reduced.shape[0] != 2 * bins:
            raise ValueError(
                f"record_global_counts: expected the reduced payload, a 1-D tensor of {2 * bins} "
                f"values (counts then numerators for {bins} bins), got {_describe(reduced)}"
            )
        reduced = reduced.detach().to(device=self._weights.device, dtype=_ACC_DTYPE)
        counts, numerators = reduced[:bins].clone(), reduced[bins:].clone()
        if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
            raise ValueError(
                f"record_global_counts: global counts must be finite and non-negative, got {counts.tolist()}"
            )
        self._global_counts, self._global_numerators = counts, numerators
        self._phase = StepPhase.REDUCED

    def metrics(self) -> DraftMetrics:
        """DP-global draft loss and counts; finite even when every count is 0."""
        if self._phase not in (StepPhase.REDUCED, StepPhase.CORRECTED):
            raise StepOrderError(
                f"metrics: the DP-global counts are not recorded yet (phase {self._phase.value}); "
                "call record_global_counts first"
            )
        assert self._weights is not None and self._global_counts is not None
        assert self._global_numerators is not None
        weighted_count = self.weighted_count
        weighted_sum = float((self._weights * self._global_numerators).sum())
        loss = weighted_sum / weighted_count if weighted_count > 0 else 0.0
        return DraftMetrics(
            loss=loss,
            weighted_count=weighted_count,
            token_count=float(self._global_counts.sum()),
            counts=self._global_counts.clone(),
            numerators=self._global_numerators.clone(),
        )

    @property
    def weighted_count(self) -> float:
        """``d = sum_b w_b C_b`` over DP-global counts."""
        if self._global_counts is None or self._weights is None:
            raise StepOrderError("weighted_count: the DP-global counts are not recorded yet")
        return float((self._weights * self._global_counts).sum())

    def correct_main_grads(self, params: Iterable[torch.nn.Parameter]) -> float | None:
        """Re-denominates draft-tagged main grads from the policy count to the draft count.

        Must follow ``scale_gradients`` (which records the policy count ``n`` each
        main grad was divided by) and precede grad norms and clipping. Each draft
        main grad is multiplied by ``n / d``; a zero ``n`` or ``d`` gives 0, never
        NaN. Returns the factor, or None for an inactive state.
        """
        params = list(params)
        draft = [p for p in params if parameter_group(p) == "draft"]
        if self._phase is StepPhase.IDLE:
            carrying = [
                p for p in draft if getattr(p, "main_grad", None) is not None and bool(main_grad(p).any())
            ]
            if carrying:
                raise StepOrderError(
                    f"correct_main_grads: {len(carrying)} draft-tagged parameter(s) carry gradients but no "
                    "draft step was begun; their gradients would stay on the policy's denominator"
                )
            return None
        if self._phase is StepPhase.ACCUMULATING:
            raise StepOrderError(
                "correct_main_grads: the DP-global counts are not recorded yet; call "
                "record_global_counts (after the count all-reduce) first"
            )
        if self._phase is StepPhase.CORRECTED:
            raise StepOrderError(
                "correct_main_grads: the draft gradients of this step were already corrected"
            )
        if not draft:
            raise ValueError(
                f"correct_main_grads: an active draft step found no draft-tagged parameter among "
                f"{len(params)} parameter(s); tag the draft head's parameters with "
                "tag_parameter(p, 'draft', ...) (matching nothing would leave the draft gradients "
                "normalised by the policy count)"
            )
        draft_count = self.weighted_count
        factor: float = 0.0
        policy_counts: set[float] = set()
        for p in draft:
            policy_count = main_grad_denominator(p)
            if policy_count is None:
                raise GradientOrderError(
                    "correct_main_grads: a draft parameter's main grad was never normalised by the "
                    "policy count; call scale_gradients before correcting"
                )
            policy_counts.add(policy_count)
        if len(policy_counts) != 1:
            raise ValueError(
                f"correct_main_grads: draft main grads were normalised by different counts {sorted(policy_counts)}"
            )
        (policy_count,) = policy_counts
        # Zero counts: no token contributed, the gradient is 0 by definition.
        if policy_count > 0 and draft_count > 0:
            factor = policy_count / draft_count
        for p in draft:
            main_grad(p).mul_(factor)
            set_main_grad_denominator(p, draft_count)
        self._phase = StepPhase.CORRECTED
        return factor

    def finish(self) -> None:
        """Ends a corrected step; the state is fresh again."""
        if self._phase is StepPhase.IDLE:
            raise StepOrderError("finish: no step in progress (finish called twice, or without begin_step)")
        if self._phase is not StepPhase.CORRECTED:
            raise StepOrderError(
                f"finish: the step's draft gradients were not corrected (phase {self._phase.value}); "
                "call correct_main_grads, or abort() to drop the step"
            )
        self._reset()

    def abort(self) -> None:
        """Drops the step from any phase; never raises, so it is safe in ``except``/``finally``."""
        self._reset()

    # -------------------------------------------------------------- internal

    def _reset(self) -> None:
        self._phase = StepPhase.IDLE
        self._num_microbatches = 0
        self._weights = None
        self._numerators = None
        self._counts = None
        self._global_counts = None
        self._global_numerators = None

    def _require(self, phase: StepPhase, what: str) -> None:
        if self._phase is phase:
            return
        if self._phase is StepPhase.IDLE:
            raise StepOrderError(f"{what}: no step in progress; call begin_step first")
        why = (
            " (this step's DP-global counts are already recorded)" if phase is StepPhase.ACCUMULATING else ""
        )
        raise StepOrderError(f"{what}: not allowed in phase {self._phase.value}, needs {phase.value}{why}")


def _fields_of(stats: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Duck-typed on DraftLossStats' three fields, so the state does not depend
    # on how the statistics were produced.
    fields = []
    for name in ("numerators", "counts", "weights"):
        value = getattr(stats, name, None)
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"accumulate: expected a DraftLossStats (with tensor numerators, counts and weights), "
                f"got {type(stats).__name__} whose {name!r} is {type(value).__name__}"
            )
        if value.dim() != 1 or not value.is_floating_point():
            raise ValueError(f"accumulate: stats.{name} must be a 1-D float tensor, got {_describe(value)}")
        fields.append(value)
    numerators, counts, weights = fields
    if not (numerators.shape == counts.shape == weights.shape):
        raise ValueError(
            f"accumulate: numerators, counts and weights must have one length, got "
            f"{tuple(numerators.shape)}, {tuple(counts.shape)}, {tuple(weights.shape)}"
        )
    return numerators, counts, weights


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"a {type(value).__name__}"
