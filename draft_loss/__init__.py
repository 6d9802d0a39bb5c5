"""The draft model's co-training loss: ordinary training code over ``torch.distributed``.

Never imports simdist: the point of the simulator is that this code runs
unmodified on simulated and real process groups.

The API, by what a training loop does with it:

* the loss: ``soft_cross_entropy`` (vocabulary sharded over TP, streamed in
  token tiles) and ``projected_soft_cross_entropy`` (the same loss from the
  hidden states and the LM head, never building the ``[T, V]`` logits) return
  binned ``DraftLossStats``; ``align_for_draft`` rolls the teacher logits and
  mask so that draft position t learns the policy at t+1;
* the split step: ``DraftStepState`` carries a step's draft statistics across
  microbatches (``StepPhase``, ``StepOrderError``, ``DraftMetrics``);
* the gradients: ``tag_parameter`` / ``parameter_group`` / ``is_tensor_parallel``
  (``GROUPS``), ``zero_main_grads``, ``accumulate_main_grads``,
  ``scale_gradients``, ``group_grad_norms``, ``clip_by_group_norms``
  (``GradientOrderError`` when out of order);
* context parallelism: ``shard_sequence`` (load-balanced CP shards),
  ``shift_left`` (the look-ahead across CP chunk ends),
  ``load_balanced_positions``, ``padded_length``.

``draft_loss.cotrain`` is not part of it: a reference co-training model (a
small Megatron-shaped policy worker with a draft head) that the tests drive
the loss through.
"""

from draft_loss.align import align_for_draft
from draft_loss.context_parallel import load_balanced_positions, padded_length, shard_sequence, shift_left
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
    "DraftLossStats",
    "DraftMetrics",
    "DraftStepState",
    "GradientOrderError",
    "StepOrderError",
    "StepPhase",
    "accumulate_main_grads",
    "align_for_draft",
    "clip_by_group_norms",
    "group_grad_norms",
    "is_tensor_parallel",
    "load_balanced_positions",
    "padded_length",
    "parameter_group",
    "projected_soft_cross_entropy",
    "scale_gradients",
    "shard_sequence",
    "shift_left",
    "soft_cross_entropy",
    "tag_parameter",
    "zero_main_grads",
]
