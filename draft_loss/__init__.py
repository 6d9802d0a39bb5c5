"""The draft model's co-training loss: ordinary training code over ``torch.distributed``.

Never imports simdist: the point of the simulator is that this code runs
unmodified on simulated and real process groups.
"""

from draft_loss.align import align_for_draft
from draft_loss.context_parallel import load_balanced_positions, padded_length, shard_sequence, shift_left
from draft_loss.cotrain import (
    CotrainBatch,
    CotrainConfig,
    CotrainWorker,
    ParallelGroups,
    StepAbortedError,
    StepResult,
    full_initial_parameters,
    parameter_layout,
    shard_batch_for_cp,
)
from draft_loss.grads import (
    GROUPS,
    GradientOrderError,
    accumulate_main_grads,
    clip_by_group_norms,
    group_grad_norms,
    is_tensor_parallel,
    parameter_group,
    scale_gradients,
    tag_parameter,
    zero_main_grads,
)
from draft_loss.projected import projected_soft_cross_entropy
from draft_loss.soft_ce import soft_cross_entropy
from draft_loss.stats import DraftLossStats
from draft_loss.step_state import DraftMetrics, DraftStepState, StepOrderError, StepPhase

__all__ = [
    "GROUPS",
    "CotrainBatch",
    "CotrainConfig",
    "CotrainWorker",
    "DraftLossStats",
    "DraftMetrics",
    "DraftStepState",
    "GradientOrderError",
    "ParallelGroups",
    "StepAbortedError",
    "StepOrderError",
    "StepPhase",
    "StepResult",
    "accumulate_main_grads",
    "align_for_draft",
    "clip_by_group_norms",
    "full_initial_parameters",
    "group_grad_norms",
    "is_tensor_parallel",
    "load_balanced_positions",
    "padded_length",
    "parameter_group",
    "parameter_layout",
    "projected_soft_cross_entropy",
    "scale_gradients",
    "shard_batch_for_cp",
    "shard_sequence",
    "shift_left",
    "soft_cross_entropy",
    "tag_parameter",
    "zero_main_grads",
]
