"""A reference co-training step: a small policy with an Eagle-style draft head.

Shaped like a Megatron policy worker so that the property tests can drive the
draft loss through everything that breaks it in real jobs:

* policy: token embedding (first PP stage), residual tanh-MLP layers split over
  PP stages (activations and their gradients travel by send/recv), MLPs
  column/row-parallel over TP, and an output layer whose vocabulary is sharded
  over TP (last stage), trained with a vocab-parallel cross-entropy on shifted
  tokens normalised by the DP-global policy token count ``n``;
* draft head (last stage): reads the detached final hidden state at t and its
  own embedding of token t+1, has its own vocab-sharded LM head, and learns the
  detached, aligned policy logits with ``soft_cross_entropy``; total loss
  ``policy + draft_loss_weight * draft``.

Two ways to run one step over a rank's batch, which must agree:

* ``monolithic``: counts are all-reduced over DP first, the whole batch is one
  forward/backward of the normalised loss;
* ``split``: ``num_microbatches`` forward/backward passes of the *raw* loss; the
  draft statistics go to a ``DraftStepState``; one DP all-reduce carries the
  policy count and the draft counts; then ``scale_gradients`` by ``1/n`` and
  ``correct_main_grads`` by ``n/d``.

Then, in both: per-group grad norms, clipping, a transactional SGD step.

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
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist

from . import grads as _grads
from ._sgd import MomentumSGD
from ._tp_layers import copy_to_tp, reduce_from_tp, vocab_parallel_cross_entropy
from .align import align_for_draft
from .context_parallel import shard_sequence, shift_left
from .grads import accumulate_main_grads, clip_by_group_norms, scale_gradients, tag_parameter, zero_main_grads
from .soft_ce import soft_cross_entropy
from .stats import DraftLossStats
from .step_state import DraftStepState

__all__ = [
    "METRIC_NAMES",
    "CotrainBatch",
    "CotrainConfig",
    "CotrainWorker",
    "ParallelGroups",
    "StepAbortedError",
    "StepResult",
    "full_initial_parameters",
    "parameter_layout",
    "shard_batch_for_cp",
]

Mode = Literal["monolithic", "split"]
Probe = Callable[[str], None]
METRIC_NAMES: tuple[str, ...] = (
    "policy_loss",
    "draft_loss",
    "policy_tokens",
    "draft_tokens",
    "draft_weighted_tokens",
)


@dataclass(frozen=True)
class CotrainConfig:
    vocab_size: int = 24
    hidden_size: int = 8
    ffn_size: int = 12
    num_layers: int = 2
    bin_weights: tuple[float, ...] = (1.0, 0.5, 2.0, 0.0)
    draft_loss_weight: float = 0.7
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.01
    policy_max_grad_norm: float | None = None
    draft_max_grad_norm: float | None = None
    token_chunk_size: int = 5
    init_std: float = 0.6
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "ffn_size", "num_layers", "token_chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CotrainConfig.{name} must be a positive int, got {value!r}")
        if not self.bin_weights or any(not (w >= 0 and math.isfinite(w)) for w in self.bin_weights):
            raise ValueError(
                f"CotrainConfig.bin_weights must be non-empty, finite, >= 0, got {self.bin_weights}"
            )
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float64):
            raise ValueError(f"CotrainConfig.dtype must be float32, bfloat16 or float64, got {self.dtype}")

    @property
    def num_bins(self) -> int:
        return len(self.bin_weights)


@dataclass(frozen=True)
class CotrainBatch:
    """One DP replica's batch (under CP: this rank's CP shard of it, see
    ``shard_batch_for_cp``). ``bin_ids[:, t]`` is the bin of the token at t
    (the draft position t-1, which predicts it, is counted in that bin)."""

    tokens: torch.Tensor  # [B, S] int64
    mask: torch.Tensor  # [B, S], 1 where the token is trained on
    bin_ids: torch.Tensor  # [B, S] int64 in [0, num_bins)


@dataclass(frozen=True)
class ParallelGroups:
    """Process groups of this rank; None means the axis is absent (size 1).

    ``dp_cp`` is the group of the DP and CP ranks holding one TP/PP shard of
    the model (Megatron's data-parallel group with context parallelism); it is
    needed only when both dp and cp have more than one rank (otherwise it is
    the one that has).
    """

    tp: dist.ProcessGroup | None = None
    cp: dist.ProcessGroup | None = None
    dp: dist.ProcessGroup | None = None
    pp: dist.ProcessGroup | None = None
    dp_cp: dist.ProcessGroup | None = None

    def data_parallel(self) -> dist.ProcessGroup | None:
        """The group counts and gradients are summed over: DP x CP."""
        if self.dp_cp is not None:
            return self.dp_cp
        if self.cp is None:
            return self.dp
        if self.dp is None:
            return self.cp
        raise ValueError(
            f"ParallelGroups: dp ({self.size('dp')} ranks) and cp ({self.size('cp')} ranks) are both "
            "present, so the dp_cp group (their product) must be given too"
        )

    def rank(self, axis: str) -> int:
        group = getattr(self, axis)
        return 0 if group is None else dist.get_rank(group)

    def size(self, axis: str) -> int:
        group = getattr(self, axis)
        return 1 if group is None else dist.get_world_size(group)


@dataclass
class StepResult:
    """What one rank saw of a step, enough to compare two runs tensor by tensor."""

    grads: dict[str, torch.Tensor]  # fp32 main grads after scaling and correction, before clipping
    params: dict[str, torch.Tensor]  # fp32 parameters after the optimizer step
    grad_norms: dict[str, float]  # per group, identical on every rank
    clip_coefficients: dict[str, float]
    metrics: dict[str, float]  # METRIC_NAMES, identical on every rank
    skipped: bool = False  # non-finite grad norm: no optimizer step


# --------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ParamLayout:
    group: str  # "policy" or "draft"
    shard_dim: int | None  # dim split over TP ranks; None: replicated
    stage: str  # "first", "last" or "layer:<i>"


def parameter_layout(config: CotrainConfig) -> dict[str, ParamLayout]:
    """Every parameter of the full model: its group, TP shard dim and PP placement."""
    out: dict[str, ParamLayout] = {"embedding.weight": ParamLayout("policy", None, "first")}
    for i in range(config.num_layers):
        where = f"layer:{i}"
        out[f"layers.{i}.fc1.weight"] = ParamLayout("policy", 0, where)
        out[f"layers.{i}.fc1.bias"] = ParamLayout("policy", 0, where)
        out[f"layers.{i}.fc2.weight"] = ParamLayout("policy", 1, where)
        out[f"layers.{i}.fc2.bias"] = ParamLayout("policy", None, where)
    out["output.weight"] = ParamLayout("policy", 0, "last")
    out["draft.embedding.weight"] = ParamLayout("draft", None, "last")
    out["draft.fc.weight"] = ParamLayout("draft", None, "last")
    out["draft.fc.bias"] = ParamLayout("draft", None, "last")
    out["draft.head.weight"] = ParamLayout("draft", 0, "last")
    return out


def full_initial_parameters(config: CotrainConfig) -> dict[str, torch.Tensor]:
    """The unsharded initial parameters in float64, a pure function of the config.

    Fresh tensors on every call (callers may change them); the values are
    drawn once per model shape, seed and scale: every rank of a job, and every
    worker a test builds, starts from the same ones.
    """
    drawn = _initial_parameters(
        config.vocab_size,
        config.hidden_size,
        config.ffn_size,
        config.num_layers,
        config.seed,
        config.init_std,
    )
    return {name: value.clone() for name, value in drawn.items()}


@functools.lru_cache(maxsize=16)
def _initial_parameters(
    V: int, H: int, F: int, num_layers: int, seed: int, init_std: float
) -> dict[str, torch.Tensor]:
    # Never handed out: full_initial_parameters returns copies.
    shapes = {"embedding.weight": (V, H)}
    for i in range(num_layers):
        shapes |= {
            f"layers.{i}.fc1.weight": (F, H),
            f"layers.{i}.fc1.bias": (F,),
            f"layers.{i}.fc2.weight": (H, F),
            f"layers.{i}.fc2.bias": (H,),
        }
    shapes |= {
        "output.weight": (V, H),
        "draft.embedding.weight": (V, H),
        "draft.fc.weight": (H, 2 * H),
        "draft.fc.bias": (H,),
        "draft.head.weight": (V, H),
    }
    generator = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(shape, generator=generator, dtype=torch.float64) * init_std
        for name, shape in shapes.items()
    }


def shard_batch_for_cp(batch: CotrainBatch, cp_rank: int, cp_size: int) -> CotrainBatch:
    """CP rank ``cp_rank``'s load-balanced shard of a DP replica's batch.

    The sequence is cut into ``2 * cp_size`` chunks, the rank keeps chunks
    ``cp_rank`` and ``2 * cp_size - 1 - cp_rank``. A length that does not divide
    is padded at the end with token 0, mask 0, bin 0: padding never trains and
    never counts, so the step equals that of the unpadded batch.
    """
    return CotrainBatch(
        *(shard_sequence(t, cp_rank, cp_size) for t in (batch.tokens, batch.mask, batch.bin_ids))
    )


def layers_of_stage(num_layers: int, stage: int, num_stages: int) -> range:
    """Contiguous layers of one PP stage; earlier stages take the remainder."""
    base, extra = divmod(num_layers, num_stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


# ------------------------------------------------------------------- worker


class StepAbortedError(RuntimeError):
    """This rank was fine, but another rank failed the step before it was committed."""


class CotrainWorker:
    """One rank's shard of the model, its optimizer and its draft step state."""

    def __init__(self, config: CotrainConfig, groups: ParallelGroups) -> None:
        self.config = config
        data_size = groups.size("dp") * groups.size("cp")
        data_group = groups.data_parallel()
        if (1 if data_group is None else dist.get_world_size(data_group)) != data_size:
            raise ValueError(
                f"CotrainWorker: the dp_cp group must have dp x cp = {groups.size('dp')} x {groups.size('cp')} "
                f"= {data_size} ranks, got {dist.get_world_size(data_group) if data_group is not None else 1}"
            )
        world = _world_group()
        model_size = data_size * groups.size("tp") * groups.size("pp")
        if world is not None and dist.get_world_size(world) != model_size:
            # The commit agreement and the grad-norm agreement are world
            # collectives: ranks outside the layout would never join them.
            raise ValueError(
                f"CotrainWorker: every rank of the job must run a worker: tp x cp x dp x pp = "
                f"{groups.size('tp')} x {groups.size('cp')} x {groups.size('dp')} x {groups.size('pp')} "
                f"= {model_size}, but the world has {dist.get_world_size(world)} ranks"
            )
        self.bind(groups)
        tp_size, tp_rank = groups.size("tp"), groups.rank("tp")
        for name, size in (("vocab_size", config.vocab_size), ("ffn_size", config.ffn_size)):
            if size % tp_size:
                raise ValueError(
                    f"CotrainWorker: {name} ({size}) must be divisible by the TP size ({tp_size})"
                )
        self.vocab_start = tp_rank * (config.vocab_size // tp_size)
        stage, stages = groups.rank("pp"), groups.size("pp")
        self.stage, self.num_stages = stage, stages
        self.is_first, self.is_last = stage == 0, stage == stages - 1
        self.layers = layers_of_stage(config.num_layers, stage, stages)
        mine = {f"layer:{i}" for i in self.layers}
        mine |= {"first"} if self.is_first else set()
        mine |= {"last"} if self.is_last else set()
        full = full_initial_parameters(config)
        self.params: dict[str, torch.nn.Parameter] = {}
        self.master: dict[str, torch.Tensor] = {}  # fp32 copies the optimizer updates
        for name, spec in parameter_layout(config).items():
            if spec.stage not in mine:
                continue
            value = full[name]
            if spec.shard_dim is not None:
                value = value.chunk(tp_size, dim=spec.shard_dim)[tp_rank]
            param = torch.nn.Parameter(value.to(config.dtype).contiguous())
            tag_parameter(param, spec.group, tensor_parallel=spec.shard_dim is not None)
            self.params[name] = param
            self.master[name] = param.detach().to(torch.float32).clone()
        self.optimizer = MomentumSGD(config.lr, config.momentum, config.weight_decay)
        self.draft_state = DraftStepState()
        self.bin_weights = torch.tensor(config.bin_weights, dtype=torch.float32)

    def bind(self, groups: ParallelGroups) -> None:
        """(Re)attaches process groups, e.g. those of a new world after a failed one."""
        coords = {axis: (groups.rank(axis), groups.size(axis)) for axis in ("tp", "cp", "dp", "pp")}
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
        """One optimizer step over this rank's batch; see the module docstring.

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
            if hasattr(p, "main_grad"):
                del p.main_grad

    # ----------------------------------------------------------- validation

    def _validate(self, batch: CotrainBatch, mode: str, num_microbatches: int) -> None:
        problem: Exception | None = None
        try:
            _check_arguments(batch, mode, num_microbatches, self.config, self.groups.size("cp"))
        except (TypeError, ValueError) as error:
            problem = error
        if self.groups.cp is not None:
            # The boundary exchange's messages are sized by the batch and run
            # once per microbatch: CP ranks must agree on both, or a peer would
            # wait for a message of another size (a hang on NCCL).
            mismatch = self._cp_disagreement(batch if problem is None else None, mode, num_microbatches)
            if problem is None and mismatch is not None:
                problem = ValueError(mismatch)
        # Ranks agree before any other collective, so a bad batch on one rank
        # fails every rank instead of leaving peers waiting.
        everyone_ok = self._agree(problem is None)
        if problem is not None:
            raise problem
        if not everyone_ok:
            raise ValueError(
                "CotrainWorker.train_step: another rank's arguments were invalid (that rank raised the "
                "details); this rank stops too"
            )

    # --------------------------------------------------------------- modes

    def _monolithic_step(self, batch: CotrainBatch, probe: Probe | None) -> StepResult:
        params = list(self.params.values())
        zero_main_grads(params)
        _call(probe, "monolithic:before_count_reduction")
        counts = torch.cat([self._policy_count(batch).reshape(1), self._draft_counts(batch)])
        self._all_reduce_counts(counts)
        policy_count, draft_counts = float(counts[0]), counts[1:]
        _call(probe, "monolithic:after_count_reduction")

        def loss_of(policy_sum: torch.Tensor, stats: DraftLossStats) -> torch.Tensor:
            policy = policy_sum * (1.0 / policy_count if policy_count > 0 else 0.0)
            draft = stats.normalized(draft_counts.to(stats.numerators.dtype))
            return policy + self.config.draft_loss_weight * draft

        sums = self._forward_backward(batch, loss_of, probe, "monolithic:microbatch:0")
        accumulate_main_grads(params)
        metrics = None
        if self.is_last:
            assert sums is not None
            policy_sum, stats = sums
            numerators = torch.cat(
                [policy_sum.detach().double().reshape(1), stats.numerators.detach().double()]
            )
            self._all_reduce_counts(numerators)
            metrics = _metrics(
                policy_sum=float(numerators[0]),
                policy_count=policy_count,
                numerators=numerators[1:],
                counts=draft_counts,
                weights=self.bin_weights.double(),
            )
        self._all_reduce_gradients(params)
        _call(probe, "monolithic:after_gradient_reduction")
        return self._finish_step(metrics, probe, "monolithic")

    def _split_step(self, batch: CotrainBatch, num_microbatches: int, probe: Probe | None) -> StepResult:
        params = list(self.params.values())
        zero_main_grads(params)
        state = self.draft_state
        if self.is_last:
            state.begin_step()
        policy_sum_local = 0.0

        def raw_loss(policy_sum: torch.Tensor, stats: DraftLossStats) -> torch.Tensor:
            # Raw sums: normalisation happens on the accumulated gradients.
            draft = (stats.weights * stats.numerators).sum()
            return policy_sum + self.config.draft_loss_weight * draft

        for k, micro in enumerate(_split_batch(batch, num_microbatches)):
            sums = self._forward_backward(micro, raw_loss, probe, f"split:microbatch:{k}")
            accumulate_main_grads(params)
            if self.is_last:
                assert sums is not None
                policy_sum_local += float(sums[0].detach().double())
                state.accumulate(sums[1].detach())
            _call(probe, f"split:microbatch:{k}:accumulated")

        _call(probe, "split:before_count_reduction")
        # The one DP x CP collective of the step's counts: the policy's count and
        # loss sum, with the draft state's counts and numerators riding along.
        payload = torch.cat(
            [
                torch.tensor([float(self._policy_count(batch)), policy_sum_local], dtype=torch.float64),
                state.contribute_counts(),
            ]
        )
        self._all_reduce_counts(payload)
        _call(probe, "split:after_count_reduction")
        policy_count, policy_sum = float(payload[0]), float(payload[1])
        state.record_global_counts(payload[2:])
        metrics = None
        if self.is_last:
            draft = state.metrics()
            metrics = _metrics(
                policy_sum=policy_sum,
                policy_count=policy_count,
                numerators=draft.numerators,
                counts=draft.counts,
                weights=self.bin_weights.double(),
            )
        self._all_reduce_gradients(params)
        _call(probe, "split:after_gradient_reduction")
        self._normalise_gradients(params, policy_count, probe)
        result = self._finish_step(metrics, probe, "split")
        if state.active:
            if result.skipped:
                state.abort()
            else:
                state.finish()
        return result

    def _normalise_gradients(
        self, params: list[torch.nn.Parameter], policy_count: float, probe: Probe | None
    ) -> None:
        """Policy normalisation of every gradient, then the draft correction (this order)."""
        scale_gradients(params, policy_count)
        _call(probe, "split:during_correction")
        self.draft_state.correct_main_grads(params)

    def _finish_step(self, metrics: dict[str, float] | None, probe: Probe | None, prefix: str) -> StepResult:
        params = list(self.params.values())
        metrics = self._share_metrics(metrics)
        grads_after = {name: p.main_grad.clone() for name, p in self.params.items()}
        norms_t = _grads.group_grad_norms(
            params, tp_group=self.groups.tp, pp_group=self.groups.pp, agree_group=_world_group()
        )
        norms = {name: float(value) for name, value in norms_t.items()}
        # Everything after the last collective that can fail runs before the
        # ranks agree to commit: one rank failing here must not leave the
        # others with an applied step that a retry would apply twice.
        failure: BaseException | None = None
        skipped, coefficients, prepared = False, {n: 1.0 for n in norms}, None
        try:
            _call(probe, f"{prefix}:after_grad_norms")
            # Norms are identical on every rank, so every rank skips together.
            skipped = not all(math.isfinite(v) for v in norms.values())
            if not skipped:
                coefficients = clip_by_group_norms(params, norms_t, self._max_norms())
                prepared = self.optimizer.prepare(
                    self.master,
                    {name: p.main_grad for name, p in self.params.items()},
                    probe=None if probe is None else (lambda point: probe(f"{prefix}:{point}")),
                )
        except Exception as error:  # re-raised below, after the agreement
            failure = error
        everyone_ok = self._agree(failure is None)
        if failure is not None:
            raise failure
        if not everyone_ok:
            raise StepAbortedError(
                "CotrainWorker.train_step: another rank failed before committing the optimizer step; "
                "no rank applied it, retry the step"
            )
        if skipped or prepared is None:
            self.abort()
        else:
            self.optimizer.commit(self.master, prepared)
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(self.master[name].to(p.dtype))
            for p in params:
                del p.main_grad
        return StepResult(
            grads_after,
            {n: m.clone() for n, m in self.master.items()},
            norms,
            coefficients,
            metrics,
            skipped=skipped,
        )

    def _max_norms(self) -> dict[str, float]:
        pairs = (("policy", self.config.policy_max_grad_norm), ("draft", self.config.draft_max_grad_norm))
        return {name: value for name, value in pairs if value is not None}

    def _agree(self, ok: bool) -> bool:
        """True on every rank iff ``ok`` on every rank: one MIN all-reduce over the world.

        One collective, not a MIN per axis: with hops over TP, then PP, then
        DP, a rank failing in the last hop leaves the other stages' DP groups
        complete, and they would commit a step that the retry applies again.
        """
        world = _world_group()
        if world is None:
            return ok
        flag = torch.tensor([1.0 if ok else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=world)
        return bool(flag.item() > 0)

    def _cp_disagreement(self, batch: CotrainBatch | None, mode: str, num_microbatches: int) -> str | None:
        """A message if the CP ranks' batch shapes, modes or microbatch counts differ (same on each CP rank).

        One MIN all-reduce of each value and its negation gives every CP rank
        the group's minimum and maximum; a rank whose arguments already failed
        (``batch`` None) contributes values that change neither.
        """
        names = ("batch rows", "local sequence length", "mode", "num_microbatches", "mask dtype")
        if batch is None:
            values = [math.inf] * (2 * len(names))
        else:
            mine = [
                *batch.tokens.shape,
                float(mode == "split"),
                float(num_microbatches),
                float(_MASK_DTYPES.index(batch.mask.dtype)),
            ]
            values = mine + [-x for x in mine]
        table = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(table, op=dist.ReduceOp.MIN, group=self.groups.cp)
        low, high = table[: len(names)].tolist(), [-x for x in table[len(names) :].tolist()]

        def shown(name: str, value: float) -> str:
            if name == "mode":
                return ("monolithic", "split")[int(value)]
            return str(_MASK_DTYPES[int(value)]) if name == "mask dtype" else f"{value:g}"

        differing = [
            f"{name} from {shown(name, lo)} to {shown(name, hi)}"
            for name, lo, hi in zip(names, low, high)
            if lo != hi and math.isfinite(lo)  # inf: every rank failed
        ]
        if not differing:
            return None
        # The boundary rows travel as raw bytes: a peer's mask of another dtype
        # would be read back as garbage, not refused.
        return (
            f"CotrainWorker.train_step: the CP ranks of one sequence shard disagree on {', '.join(differing)}; "
            "every CP rank must pass its shard of the same batch "
            "(shard_batch_for_cp) with the same mode and num_microbatches"
        )

    # --------------------------------------------------------- forward/back

    def _forward_backward(
        self,
        batch: CotrainBatch,
        loss_of: Callable[[torch.Tensor, DraftLossStats], torch.Tensor],
        probe: Probe | None,
        point: str,
    ) -> tuple[torch.Tensor, DraftLossStats] | None:
        """One pipelined forward and backward of ``batch``; (policy sum, draft stats) on the last stage."""
        _call(probe, f"{point}:forward")
        tokens = batch.tokens
        shape = (*tokens.shape, self.config.hidden_size)
        h_in: torch.Tensor | None = None
        if self.is_first:
            hidden = self.params["embedding.weight"][tokens]
        else:
            h_in = torch.empty(shape, dtype=self.config.dtype)
            dist.recv(h_in, src=self._pp_peer(-1), group=self.groups.pp)
            h_in.requires_grad_(True)
            hidden = h_in
        for i in self.layers:
            hidden = self._layer(i, hidden)
        sums = None
        if self.is_last:
            policy_sum, stats = self._losses(batch, hidden)
            loss = loss_of(policy_sum, stats)
            _call(probe, f"{point}:backward")
            loss.backward()
            sums = (policy_sum, stats)
        else:
            dist.send(hidden.detach().contiguous(), dst=self._pp_peer(+1), group=self.groups.pp)
            grad_out = torch.empty(shape, dtype=self.config.dtype)
            dist.recv(grad_out, src=self._pp_peer(+1), group=self.groups.pp)
            _call(probe, f"{point}:backward")
            if hidden.requires_grad:
                torch.autograd.backward(hidden, grad_out)
        if h_in is not None:
            grad_in = h_in.grad if h_in.grad is not None else torch.zeros(shape, dtype=self.config.dtype)
            dist.send(grad_in.contiguous(), dst=self._pp_peer(-1), group=self.groups.pp)
        return sums

    def _layer(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        p, tp = self.params, self.groups.tp
        inner = torch.tanh(copy_to_tp(hidden, tp) @ p[f"layers.{i}.fc1.weight"].T + p[f"layers.{i}.fc1.bias"])
        out = reduce_from_tp(inner @ p[f"layers.{i}.fc2.weight"].T, tp)
        return hidden + out + p[f"layers.{i}.fc2.bias"]

    def _losses(self, batch: CotrainBatch, hidden: torch.Tensor) -> tuple[torch.Tensor, DraftLossStats]:
        p, tp = self.params, self.groups.tp
        logits = copy_to_tp(hidden, tp) @ p["output.weight"].T  # [B, S, V_local]
        # The token at t+1 (policy label, draft input), its mask and bin, with
        # their boundary rows from the CP neighbours.
        cp = self.groups.cp
        labels, next_mask, next_bins = shift_left(batch.tokens, batch.mask, batch.bin_ids, cp_group=cp)
        shifted_mask = next_mask.to(torch.float32)
        ce = vocab_parallel_cross_entropy(logits, labels, vocab_start=self.vocab_start, group=tp)
        policy_sum = (ce * shifted_mask).sum()
        # Draft position t: hidden state at t (detached: the draft does not
        # train the policy) and the draft's embedding of token t+1, looked up
        # here from the token id, so its gradient lands in this rank's replica.
        # (Without CP the call keeps its two-argument form, which the fuzz
        # catalogue's alignment mutants replace.)
        if cp is None:
            teacher, draft_mask = align_for_draft(logits.detach(), batch.mask)
        else:
            teacher, draft_mask = align_for_draft(logits.detach(), batch.mask, cp_group=cp)
        draft_input = torch.cat([hidden.detach(), p["draft.embedding.weight"][labels]], dim=-1)
        draft_hidden = torch.tanh(draft_input @ p["draft.fc.weight"].T + p["draft.fc.bias"])
        draft_logits = copy_to_tp(draft_hidden, tp) @ p["draft.head.weight"].T
        stats = soft_cross_entropy(
            draft_logits,
            teacher,
            draft_mask.to(torch.float32),
            tp_group=tp,
            token_chunk_size=self.config.token_chunk_size,
            bin_ids=next_bins,
            weights=self.bin_weights,
        )
        return policy_sum, stats

    # ---------------------------------------------------------- collectives

    def _pp_peer(self, offset: int) -> int:
        return dist.get_global_rank(self.groups.pp, self.stage + offset)

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
        flat = torch.cat([p.main_grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for p in params:
            p.main_grad.copy_(flat[offset : offset + p.numel()].view_as(p.main_grad))
            offset += p.numel()

    def _share_metrics(self, metrics: dict[str, float] | None) -> dict[str, float]:
        """Metrics live on the last stage; every stage joins one PP all-reduce to report them."""
        vector = torch.zeros(len(METRIC_NAMES), dtype=torch.float64)
        if metrics is not None:
            vector = torch.tensor([metrics[name] for name in METRIC_NAMES], dtype=torch.float64)
        if self.groups.pp is not None:
            dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=self.groups.pp)
        return {name: float(vector[i]) for i, name in enumerate(METRIC_NAMES)}

    def _predicted_mask(self, batch: CotrainBatch) -> torch.Tensor:
        """The mask of the tokens some position predicts: all but the sequence's first (float64).

        Counted where the token lives, so no boundary exchange is needed; the
        DP x CP sums equal those of the shifted masks.
        """
        mask = batch.mask.to(torch.float64).clone()
        if self.groups.rank("cp") == 0:
            mask[:, 0] = 0.0  # the first chunk starts the sequence
        return mask

    def _policy_count(self, batch: CotrainBatch) -> torch.Tensor:
        """Local shifted-token count, ``sum(mask[:, 1:])`` of the unsharded sequence summed over CP."""
        return self._predicted_mask(batch).sum()

    def _draft_counts(self, batch: CotrainBatch) -> torch.Tensor:
        """Local per-bin draft token counts, known from the masks before any forward."""
        return torch.bincount(
            batch.bin_ids.reshape(-1),
            weights=self._predicted_mask(batch).reshape(-1),
            minlength=self.config.num_bins,
        ).to(torch.float64)


# ------------------------------------------------------------------ helpers


def _world_group() -> dist.ProcessGroup | None:
    """Every rank of the job, or None for a single process without torch.distributed."""
    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def _call(probe: Probe | None, point: str) -> None:
    if probe is not None:
        probe(point)


def _split_batch(batch: CotrainBatch, parts: int) -> list[CotrainBatch]:
    return [
        CotrainBatch(tokens, mask, bins)
        for tokens, mask, bins in zip(
            batch.tokens.tensor_split(parts),
            batch.mask.tensor_split(parts),
            batch.bin_ids.tensor_split(parts),
        )
    ]


def _metrics(
    *,
    policy_sum: float,
    policy_count: float,
    numerators: torch.Tensor,
    counts: torch.Tensor,
    weights: torch.Tensor,
) -> dict[str, float]:
    weighted_count = float((weights * counts).sum())
    weighted_sum = float((weights * numerators).sum())
    return {
        "policy_loss": policy_sum / policy_count if policy_count > 0 else 0.0,
        "draft_loss": weighted_sum / weighted_count if weighted_count > 0 else 0.0,
        "policy_tokens": policy_count,
        "draft_tokens": float(counts.sum()),
        "draft_weighted_tokens": weighted_count,
    }


_MASK_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
)


def _check_arguments(
    batch: object, mode: object, num_microbatches: object, config: CotrainConfig, cp_size: int = 1
) -> None:
    what = "CotrainWorker.train_step"
    if mode not in ("monolithic", "split"):
        raise ValueError(f"{what}: mode must be 'monolithic' or 'split', got {mode!r}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise ValueError(f"{what}: num_microbatches must be a positive int, got {num_microbatches!r}")
    if not isinstance(batch, CotrainBatch):
        raise TypeError(f"{what}: batch must be a CotrainBatch, got {type(batch).__name__}")
    tokens, mask, bins = batch.tokens, batch.mask, batch.bin_ids
    for name, value in (("tokens", tokens), ("mask", mask), ("bin_ids", bins)):
        if not isinstance(value, torch.Tensor) or value.dim() != 2:
            raise ValueError(f"{what}: batch.{name} must be a 2-D [batch, seq] tensor, got {value!r:.80}")
    if not (tokens.shape == mask.shape == bins.shape):
        raise ValueError(
            f"{what}: batch.tokens, mask and bin_ids must share one shape, got "
            f"{tuple(tokens.shape)}, {tuple(mask.shape)}, {tuple(bins.shape)}"
        )
    if mask.dtype not in _MASK_DTYPES:
        raise TypeError(f"{what}: batch.mask must be bool, integer or real floating, got {mask.dtype}")
    rows, seq = tokens.shape
    if rows < 1 or seq < 2:
        raise ValueError(
            f"{what}: batch needs at least 1 row and 2 positions, got shape {tuple(tokens.shape)}"
        )
    for name, value in (("tokens", tokens), ("bin_ids", bins)):
        if value.dtype != torch.int64:
            raise TypeError(f"{what}: batch.{name} must be int64, got {value.dtype}")
    if bool(((tokens < 0) | (tokens >= config.vocab_size)).any()):
        raise ValueError(f"{what}: batch.tokens must lie in [0, {config.vocab_size})")
    if bool(((bins < 0) | (bins >= config.num_bins)).any()):
        raise ValueError(f"{what}: batch.bin_ids must lie in [0, {config.num_bins})")
    if cp_size > 1 and seq % 2:
        raise ValueError(
            f"{what}: under context parallelism ({cp_size} CP ranks) a rank's batch is its two load-balanced "
            f"chunks, so its sequence length must be even, got {seq}; shard with shard_batch_for_cp"
        )
    if mode == "split" and num_microbatches > rows:
        raise ValueError(
            f"{what}: num_microbatches ({num_microbatches}) exceeds this rank's {rows} batch rows"
        )
