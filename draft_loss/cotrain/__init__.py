"""A reference co-training step: a small policy with an Eagle-style draft head.

Not part of the loss API: a model shaped like a Megatron policy worker, so
that the property tests can drive the draft loss through everything that
breaks it in real jobs:

* policy: token embedding (first PP stage), residual tanh-MLP layers split over
  PP stages (activations and their gradients travel by send/recv), MLPs
  column/row-parallel over TP, and an output layer whose vocabulary is sharded
  over TP (last stage), trained with a vocab-parallel cross-entropy on shifted
  tokens normalised by the DP-global policy token count ``n``;
* draft head (last stage): reads the detached final hidden state at t and its
  own embedding of token t+1, has its own vocab-sharded LM head, and learns the
  detached, aligned policy logits with ``soft_cross_entropy``; total loss
  ``policy + draft_loss_weight * draft``.

``CotrainWorker.train_step`` runs one step in two ways that must agree
(``monolithic``: one normalised forward/backward; ``split``: microbatches of
the raw loss through a ``DraftStepState``, then ``scale_gradients`` and the
draft correction), then grad norms, clipping and a transactional SGD step.

Context parallelism: each rank's batch is its CP shard (``shard_batch_for_cp``:
Megatron's load-balanced chunks r and 2cp-1-r, padded with masked-out tokens
when the length does not divide by 2cp). The model is per token, so CP only
touches the one-token look-ahead (the policy's label, the draft's token t+1
embedding input, its teacher logits, mask and bin at t+1), whose boundary rows
come from the neighbouring CP ranks (``context_parallel.shift_left``), and the
reductions: counts, numerators and gradients are summed over DP x CP
(``ParallelGroups.dp_cp``). Parameters are replicated over CP, and every
token's loss is divided by the DP x CP-global count, so the gradient SUM over
DP x CP is already the whole batch's gradient: the draft correction stays
``n / d`` with no CP factor, and grad norms are not reduced over CP.

Modules, one job each: ``config`` (hyper-parameters), ``groups`` (a rank's
process groups), ``batch`` (checks, CP shards, microbatches, token counts),
``parameters`` (placement, initial values, a rank's shards), ``model`` (a
stage's layers and losses), ``tp_layers`` (Megatron-style TP ops),
``pipeline`` (the send/recv schedule of one microbatch), ``agreement`` (the
ranks' agreement on arguments and on committing), ``commit`` (norms, clipping,
the optimizer step), ``sgd`` (the two-phase optimizer), ``metrics``,
``probe`` (fault-injection points) and ``worker`` (the two modes of a step).
"""

from .batch import CotrainBatch, shard_batch_for_cp
from .commit import StepAbortedError, StepResult
from .config import CotrainConfig
from .groups import ParallelGroups
from .metrics import METRIC_NAMES
from .parameters import ParameterPlacement, full_initial_parameters, parameter_placements
from .worker import CotrainWorker

__all__ = [
    "METRIC_NAMES",
    "CotrainBatch",
    "CotrainConfig",
    "CotrainWorker",
    "ParallelGroups",
    "ParameterPlacement",
    "StepAbortedError",
    "StepResult",
    "full_initial_parameters",
    "parameter_placements",
    "shard_batch_for_cp",
]
