"""``CotrainWorker``: one rank's step of the reference model, in either of its two modes.

* ``monolithic``: counts are all-reduced over DP x CP first, the whole batch is
  one forward/backward of the normalised loss;
* ``split``: ``num_microbatches`` forward/backward passes of the *raw* loss; the
  draft statistics go to a ``DraftStepState``; one DP x CP all-reduce carries
  the policy count and the draft counts; then ``scale_gradients`` by ``1/n``
  and ``correct_main_grads`` by ``n/d``.

Then, in both, ``commit_step``: per-group grad norms, clipping, a transactional
SGD step.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist

from ..grads import accumulate_main_grads, drop_main_grads, main_grad, scale_gradients, zero_main_grads
from ..stats import DraftLossStats
from ..step_state import DraftStepState
from .agreement import agree_on_arguments
from .batch import CotrainBatch, draft_counts, policy_count, split_batch
from .commit import StepResult, commit_step
from .config import CotrainConfig
from .groups import ParallelGroups, check_groups_fit_the_job
from .metrics import share_metrics, step_metrics
from .model import StageModel
from .pipeline import forward_backward
from .probe import Probe, reach
from .sgd import MomentumSGD

Mode = Literal["monolithic", "split"]


class CotrainWorker:
    """One rank's shard of the model, its optimizer and its draft step state."""

    def __init__(self, config: CotrainConfig, groups: ParallelGroups) -> None:
        self.config = config
        check_groups_fit_the_job(groups)
        self.bind(groups)
        self.model = StageModel(config, groups)
        self.params: dict[str, torch.nn.Parameter] = self.model.params
        # fp32 copies the optimizer updates
        self.master = {name: p.detach().to(torch.float32).clone() for name, p in self.params.items()}
        self.optimizer = MomentumSGD(config.lr, config.momentum, config.weight_decay)
        self.draft_state = DraftStepState()

    def bind(self, groups: ParallelGroups) -> None:
        """(Re)attaches process groups, e.g. those of a new world after a failed one."""
        coords = groups.coordinates()
        previous = getattr(self, "_coords", None)
        if previous is not None and previous != coords:
            raise ValueError(f"CotrainWorker.bind: rank coordinates changed from {previous} to {coords}")
        self.groups, self._coords = groups, coords

    # ------------------------------------------------------------ the step

    def train_step(
        self,
        batch: CotrainBatch,
        *,
        mode: Mode = "split",
        num_microbatches: int = 1,
        probe: Probe | None = None,
    ) -> StepResult:
        """One optimizer step over this rank's batch; see the package docstring.

        ``probe(point)``, if given, is called at named points of the step (fault
        injection in tests). Any exception aborts the step: the draft state is
        reset, gradients are dropped, parameters keep their values, and the
        exception propagates.
        """
        try:
            self._validate(batch, mode, num_microbatches)
            if mode == "monolithic":
                return self._monolithic_step(batch, probe)
            return self._split_step(batch, num_microbatches, probe)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drops a step in progress; parameters and optimizer state are untouched."""
        self.draft_state.abort()
        for p in self.params.values():
            p.grad = None
        drop_main_grads(self.params.values())

    def _validate(self, batch: CotrainBatch, mode: str, num_microbatches: int) -> None:
        agree_on_arguments(batch, mode, num_microbatches, self.config, self.groups)

    # --------------------------------------------------------------- modes

    def _monolithic_step(self, batch: CotrainBatch, probe: Probe | None) -> StepResult:
        params = list(self.params.values())
        zero_main_grads(params)
        reach(probe, "monolithic:before_count_reduction")
        counts = torch.cat([self._policy_count(batch).reshape(1), self._draft_counts(batch)])
        self._all_reduce_counts(counts)
        policy_count, draft_counts = float(counts[0]), counts[1:]
        reach(probe, "monolithic:after_count_reduction")

        def loss_of(policy_sum: torch.Tensor, stats: DraftLossStats) -> torch.Tensor:
            policy = policy_sum * (1.0 / policy_count if policy_count > 0 else 0.0)
            draft = stats.normalized(draft_counts.to(stats.numerators.dtype))
            return policy + self.config.draft_loss_weight * draft

        sums = forward_backward(self.model, self.groups, batch, loss_of, probe, "monolithic:microbatch:0")
        accumulate_main_grads(params)
        metrics = None
        if sums is not None:  # the last stage
            policy_sum, stats = sums
            numerators = torch.cat(
                [policy_sum.detach().double().reshape(1), stats.numerators.detach().double()]
            )
            self._all_reduce_counts(numerators)
            metrics = step_metrics(
                policy_sum=float(numerators[0]),
                policy_count=policy_count,
                numerators=numerators[1:],
                counts=draft_counts,
                weights=self.model.bin_weights.double(),
            )
        self._all_reduce_gradients(params)
        reach(probe, "monolithic:after_gradient_reduction")
        return self._finish_step(metrics, probe, "monolithic")

    def _split_step(self, batch: CotrainBatch, num_microbatches: int, probe: Probe | None) -> StepResult:
        params = list(self.params.values())
        zero_main_grads(params)
        state = self.draft_state
        if self.model.is_last:
            state.begin_step()
        policy_sum_local = self._accumulate_microbatches(batch, num_microbatches, params, probe)
        reach(probe, "split:before_count_reduction")
        # The one DP x CP collective of the step's counts: the policy's count and
        # loss sum, with the draft state's counts and numerators riding along.
        payload = torch.cat(
            [
                torch.tensor([float(self._policy_count(batch)), policy_sum_local], dtype=torch.float64),
                state.contribute_counts(),
            ]
        )
        self._all_reduce_counts(payload)
        reach(probe, "split:after_count_reduction")
        policy_count, policy_sum = float(payload[0]), float(payload[1])
        state.record_global_counts(payload[2:])
        metrics = None
        if self.model.is_last:
            draft = state.metrics()
            metrics = step_metrics(
                policy_sum=policy_sum,
                policy_count=policy_count,
                numerators=draft.numerators,
                counts=draft.counts,
                weights=self.model.bin_weights.double(),
            )
        self._all_reduce_gradients(params)
        reach(probe, "split:after_gradient_reduction")
        self._normalise_gradients(params, policy_count, probe)
        result = self._finish_step(metrics, probe, "split")
        if state.active:
            if result.skipped:
                state.abort()
            else:
                state.finish()
        return result

    def _accumulate_microbatches(
        self,
        batch: CotrainBatch,
        num_microbatches: int,
        params: list[torch.nn.Parameter],
        probe: Probe | None,
    ) -> float:
        """Forward/backward of each microbatch's raw loss; returns the local policy loss sum."""

        def raw_loss(policy_sum: torch.Tensor, stats: DraftLossStats) -> torch.Tensor:
            # Raw sums: normalisation happens on the accumulated gradients.
            draft = (stats.weights * stats.numerators).sum()
            return policy_sum + self.config.draft_loss_weight * draft

        policy_sum_local = 0.0
        for k, micro in enumerate(split_batch(batch, num_microbatches)):
            sums = forward_backward(self.model, self.groups, micro, raw_loss, probe, f"split:microbatch:{k}")
            accumulate_main_grads(params)
            if sums is not None:  # the last stage
                policy_sum_local += float(sums[0].detach().double())
                self.draft_state.accumulate(sums[1].detach())
            reach(probe, f"split:microbatch:{k}:accumulated")
        return policy_sum_local

    def _normalise_gradients(
        self, params: list[torch.nn.Parameter], policy_count: float, probe: Probe | None
    ) -> None:
        """Policy normalisation of every gradient, then the draft correction (this order)."""
        scale_gradients(params, policy_count)
        reach(probe, "split:during_correction")
        self.draft_state.correct_main_grads(params)

    def _finish_step(self, metrics: dict[str, float] | None, probe: Probe | None, prefix: str) -> StepResult:
        shared = share_metrics(metrics, self.groups.pp, self.groups.tp)
        grads_after = {name: main_grad(p).clone() for name, p in self.params.items()}
        commit = commit_step(
            self.params,
            self.master,
            self.optimizer,
            self.groups,
            self.config.max_grad_norms(),
            probe,
            prefix,
        )
        if commit.skipped:
            self.abort()
        return StepResult(
            grads_after,
            {n: m.clone() for n, m in self.master.items()},
            commit.grad_norms,
            commit.clip_coefficients,
            shared,
            skipped=commit.skipped,
        )

    # ---------------------------------------------------------- collectives

    def _all_reduce_counts(self, tensor: torch.Tensor) -> None:
        """Counts and loss sums: every token of the step lives on one DP x CP rank."""
        group = self.groups.data_parallel()
        if group is not None:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)

    def _all_reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        # One flat bucket: a single collective per step, as DDP buckets do.
        # A SUM, not an average: each rank's loss is already divided by the
        # DP x CP-global counts.
        group = self.groups.data_parallel()
        if group is None or not params:
            return
        flat = torch.cat([main_grad(p).reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for p in params:
            grad = main_grad(p)
            grad.copy_(flat[offset : offset + p.numel()].view_as(grad))
            offset += p.numel()

    def _policy_count(self, batch: CotrainBatch) -> torch.Tensor:
        return policy_count(batch, starts_sequence=self.groups.rank("cp") == 0)

    def _draft_counts(self, batch: CotrainBatch) -> torch.Tensor:
        return draft_counts(batch, self.groups.rank("cp") == 0, self.config.num_bins)
