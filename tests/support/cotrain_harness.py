"""Drives ``draft_loss.cotrain`` on simdist and compares runs with each other and
with the float64 reference (``cotrain_reference``).

Shared by the parity, abort/retry and mutant suites, so the mutants are judged
by exactly the checks the parity suite makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import torch
from cotrain_reference import ReferenceResult, reference_step

import simdist
from draft_loss.context_parallel import padded_length
from draft_loss.cotrain import (
    METRIC_NAMES,
    CotrainBatch,
    CotrainConfig,
    CotrainWorker,
    ParallelGroups,
    StepResult,
    full_initial_parameters,
    shard_batch_for_cp,
)
from simdist import Layout

ROWS_PER_REPLICA = 4
SEQ_LEN = 6
SCENARIOS = ("uneven", "empty", "zero_weight")
# "boundary" needs cp to know where the chunks meet; the CP suites draw from these.
CP_SCENARIOS = SCENARIOS + ("boundary",)
ZERO_WEIGHT_BIN = 3  # CotrainConfig's default bin_weights end with a 0.0


# ------------------------------------------------------------------ batches


def make_global_batch(
    scenario: str, dp: int, config: CotrainConfig, seed: int = 0, *, seq_len: int = SEQ_LEN, cp: int = 1
):
    """``(tokens, mask, bin_ids)`` of shape ``[dp * ROWS_PER_REPLICA, seq_len]``.

    "uneven": token counts differ across DP replicas and microbatches; replica 0
    has a row with no valid token and a row whose only valid token is the
    first (which leaves no shifted token); the last replica (when dp > 1) has
    no valid token at all. "empty": no valid token anywhere. "zero_weight":
    tokens only in a bin of weight 0, so the weighted draft count is 0 while
    the policy count is not. "boundary": valid tokens only where the 2 * cp
    load-balanced chunks meet: even rows at each chunk's first position (so
    the only trained draft and policy positions are the chunk ends, whose
    token t+1 lives on another CP rank or in the rank's other chunk), odd rows
    at each chunk's last position.
    """
    g = torch.Generator().manual_seed(seed)
    rows = dp * ROWS_PER_REPLICA
    tokens = torch.randint(0, config.vocab_size, (rows, seq_len), generator=g)
    bins = torch.randint(0, config.num_bins, (rows, seq_len), generator=g)
    if scenario == "uneven":
        density = torch.linspace(0.9, 0.3, dp).repeat_interleave(ROWS_PER_REPLICA).unsqueeze(1)
        mask = (torch.rand(rows, seq_len, generator=g) < density).to(torch.float32)
        mask[0] = 0.0
        mask[1] = 0.0
        mask[1, 0] = 1.0
        mask[2, 1:] = 1.0
        if dp > 1:
            mask[-ROWS_PER_REPLICA:] = 0.0
    elif scenario == "empty":
        mask = torch.zeros(rows, seq_len)
    elif scenario == "zero_weight":
        mask = (torch.rand(rows, seq_len, generator=g) < 0.7).to(torch.float32)
        bins = torch.full_like(bins, ZERO_WEIGHT_BIN)
    elif scenario == "boundary":
        chunk = padded_length(seq_len, cp) // (2 * cp) if cp > 1 else -(-seq_len // 2)
        heads = [k * chunk for k in range(1, 2 * cp) if k * chunk < seq_len]
        tails = [k * chunk - 1 for k in range(1, 2 * cp + 1) if k * chunk - 1 < seq_len]
        mask = torch.zeros(rows, seq_len)
        mask[0::2, heads] = 1.0
        mask[1::2, tails] = 1.0
    else:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of {CP_SCENARIOS}")
    return tokens, mask, bins


def local_batch(global_batch, dp_rank: int, cp_rank: int = 0, cp_size: int = 1) -> CotrainBatch:
    """DP replica ``dp_rank``'s rows; with ``cp_size > 1``, CP rank ``cp_rank``'s shard of them."""
    rows = slice(dp_rank * ROWS_PER_REPLICA, (dp_rank + 1) * ROWS_PER_REPLICA)
    tokens, mask, bins = global_batch
    batch = CotrainBatch(tokens[rows].clone(), mask[rows].clone(), bins[rows].clone())
    return cp_shard(batch, cp_rank, cp_size)


def cp_shard(batch: CotrainBatch, cp_rank: int, cp_size: int) -> CotrainBatch:
    """A DP replica's batch as CP rank ``cp_rank`` holds it (unchanged when ``cp_size`` is 1)."""
    return batch if cp_size == 1 else shard_batch_for_cp(batch, cp_rank, cp_size)


def rank_batch(ctx, global_batch) -> CotrainBatch:
    """This rank's batch: its DP replica's rows, its CP shard of them."""
    return local_batch(global_batch, ctx.coords.dp, ctx.coords.cp, ctx.layout.cp)


def groups_of(ctx) -> ParallelGroups:
    """The layout's groups, None for axes of size 1 (the code under test's convention)."""
    layout = ctx.layout
    groups = {
        axis: getattr(ctx.groups, axis) if getattr(layout, axis) > 1 else None
        for axis in ("tp", "cp", "dp", "pp")
    }
    return ParallelGroups(**groups, dp_cp=ctx.groups.dp_cp if layout.dp * layout.cp > 1 else None)


# ---------------------------------------------------------------------- runs


def _both_modes_body(ctx, config, global_batch, num_microbatches, modes):
    batch = rank_batch(ctx, global_batch)
    out = {}
    for mode in modes:
        worker = CotrainWorker(config, groups_of(ctx))
        out[mode] = worker.train_step(batch, mode=mode, num_microbatches=num_microbatches)
    return out


def run_modes(
    layout: Layout,
    config: CotrainConfig,
    scenario: str,
    num_microbatches: int,
    modes: Sequence[str] = ("monolithic", "split"),
    seed: int = 0,
    *,
    seq_len: int = SEQ_LEN,
) -> tuple[dict[str, list[StepResult]], tuple]:
    global_batch = make_global_batch(scenario, layout.dp, config, seed, seq_len=seq_len, cp=layout.cp)
    per_rank = simdist.run(
        _both_modes_body,
        layout=layout,
        args=(config, global_batch, num_microbatches, tuple(modes)),
        timeout=120.0,
    )
    return {mode: [r[mode] for r in per_rank] for mode in modes}, global_batch


def reference_of(
    config: CotrainConfig, global_batch, *, dtype: torch.dtype = torch.float64
) -> ReferenceResult:
    # The reference starts from the very values the workers start from: the
    # float64 initial parameters rounded through the model dtype.
    initial = {n: v.to(config.dtype).to(torch.float64) for n, v in full_initial_parameters(config).items()}
    return reference_step(config, initial, *global_batch, dtype=dtype)


# --------------------------------------------------------------- comparison


def shard_dim(name: str) -> int | None:
    """TP sharding of the cotrain model's parameters (Megatron's column/row/vocab-parallel layers)."""
    if name.endswith(("fc1.weight", "fc1.bias")) or name in ("output.weight", "draft.head.weight"):
        return 0
    if name.endswith("fc2.weight"):
        return 1
    return None


def shard(full: torch.Tensor, name: str, tp_rank: int, tp: int) -> torch.Tensor:
    dim = shard_dim(name)
    # tensor_split, as the workers shard (the first ranks take the remainder);
    # written here without draft_loss's own helper, so a wrong split there shows.
    return full if dim is None else full.tensor_split(tp, dim=dim)[tp_rank]


def _close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> float:
    """Raises unless ``actual`` is within tolerance; returns the largest absolute error."""
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    error = (actual - expected).abs()
    allowed = atol + rtol * expected.abs()
    if not bool((error <= allowed).all()):
        worst = int((error - allowed).argmax())
        raise AssertionError(
            f"{what}: max error {float(error.max()):.3e} exceeds tolerance (rtol={rtol}, atol={atol:.3e}); "
            f"worst element {float(actual.reshape(-1)[worst]):.8e} vs {float(expected.reshape(-1)[worst]):.8e}"
        )
    return float(error.max()) if error.numel() else 0.0


def check_ranks_agree(layout: Layout, results: list[StepResult], mode: str) -> None:
    """Metrics and grad norms are identical, bit for bit, on every rank."""
    first = results[0]
    for rank, result in enumerate(results):
        assert result.metrics == first.metrics, (
            f"{mode}: rank {rank} metrics {result.metrics} != rank 0 {first.metrics}"
        )
        assert result.grad_norms == first.grad_norms, (
            f"{mode}: rank {rank} grad norms {result.grad_norms} != rank 0 {first.grad_norms}"
        )
        assert result.skipped == first.skipped


def check_against(
    layout: Layout,
    results: list[StepResult],
    expected: Callable[[int], StepResult | ReferenceResult],
    *,
    rtol: float,
    atol_fraction: float,
    what: str,
    tp_sharded_expected: bool,
    ranks: Iterable[int] | None = None,
) -> dict[str, float]:
    """Grads, params, norms and metrics of every rank against ``expected(rank)``.

    Returns the worst errors: of grads, norms and params relative to the
    model-wide scale of each, of metrics absolute.

    ``atol_fraction`` is relative to the largest magnitude of the compared
    quantity over the whole model, so tiny entries are judged at the scale of
    the big ones (the rounding they carry comes from sums of big terms).

    ``ranks`` limits the comparison to those ranks (default: every rank), for
    callers that have already shown the others to hold bitwise the same values
    as one of them against the same expectation (DP replicas).
    """
    sample = expected(0)
    grad_scale = max(float(t.abs().max()) for t in _values(sample.grads)) or 1.0
    param_scale = max(float(t.abs().max()) for t in _values(sample.params)) or 1.0
    worst = {"grads": 0.0, "params": 0.0, "grad_norms": 0.0, "metrics": 0.0}
    for rank in range(len(results)) if ranks is None else ranks:
        result = results[rank]
        coords = layout.coords(rank)
        exp = expected(rank)
        for kind, scale in (("grads", grad_scale), ("params", param_scale)):
            actual: dict[str, torch.Tensor] = getattr(result, kind)
            refs = {
                name: shard(getattr(exp, kind)[name], name, coords.tp, layout.tp)
                if tp_sharded_expected
                else getattr(exp, kind)[name]
                for name in actual
            }
            error = _close_all(actual, refs, rtol, atol_fraction * scale, f"{what}: rank {rank} {kind[:-1]}")
            worst[kind] = max(worst[kind], error / scale)
        norms = torch.tensor([result.grad_norms[group] for group in ("policy", "draft")])
        ref_norms = torch.tensor([exp.grad_norms[group] for group in ("policy", "draft")])
        if not _within(norms, ref_norms, rtol, atol_fraction * grad_scale):
            for group in ("policy", "draft"):  # the first one out of tolerance raises
                _close(
                    torch.tensor(result.grad_norms[group]),
                    torch.tensor(exp.grad_norms[group]),
                    rtol,
                    atol_fraction * grad_scale,
                    f"{what}: rank {rank} {group} grad norm",
                )
        worst["grad_norms"] = max(worst["grad_norms"], _max_error(norms, ref_norms) / grad_scale)
        metrics = torch.tensor([result.metrics[metric] for metric in METRIC_NAMES])
        ref_metrics = torch.tensor([exp.metrics[metric] for metric in METRIC_NAMES])
        if not _within(metrics, ref_metrics, rtol, atol_fraction):
            for metric in METRIC_NAMES:
                _close(
                    torch.tensor(result.metrics[metric]),
                    torch.tensor(exp.metrics[metric]),
                    rtol,
                    atol_fraction,
                    f"{what}: rank {rank} metric {metric}",
                )
        worst["metrics"] = max(worst["metrics"], _max_error(metrics, ref_metrics))
    # Every parameter of the model is owned by some rank.
    owned = set().union(*(r.grads.keys() for r in results))
    assert owned == set(sample.grads) or not tp_sharded_expected, (
        f"{what}: parameters {set(sample.grads) - owned} unowned"
    )
    return worst


# The comparisons are elementwise, so one rank's tensors of a kind are judged
# as one flat float64 vector (a handful of torch ops instead of a handful per
# tensor: the checks cost as much as a small world otherwise). Only when that
# vector is out of tolerance are the tensors compared one by one, so the
# error names the first one that fails, exactly as a per-tensor loop would.


def _flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    # cat promotes mixed floating dtypes to the widest, which holds every value exactly.
    parts = [t.reshape(-1) for t in tensors]
    return torch.cat(parts).to(torch.float64) if parts else torch.zeros(0, dtype=torch.float64)


def _within(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> bool:
    actual, expected = actual.to(torch.float64), expected.to(torch.float64)
    return bool(((actual - expected).abs() <= atol + rtol * expected.abs()).all())


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    error = (actual.to(torch.float64) - expected.to(torch.float64)).abs()
    return float(error.max()) if error.numel() else 0.0


def _close_all(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], rtol: float, atol: float, what: str
) -> float:
    """``_close`` of every ``actual[name]`` against ``expected[name]`` (message ``"{what} {name}"``);
    returns the largest absolute error over all of them."""
    flat_actual, flat_expected = _flat(actual.values()), _flat(expected[name] for name in actual)
    same_shapes = all(value.shape == expected[name].shape for name, value in actual.items())
    if not same_shapes or not _within(flat_actual, flat_expected, rtol, atol):
        for name, value in actual.items():
            _close(value, expected[name], rtol, atol, f"{what} {name}")
    return _max_error(flat_actual, flat_expected)


def _values(d) -> Iterable[torch.Tensor]:
    return [v for v in d.values() if v.numel()]


# Tolerances. float32: everything is computed in float32 from the same inputs;
# the split and monolithic paths differ only in summation order (microbatch
# sums, 1/n then n/d instead of 1/d), a few float32 roundings of 6e-8 each on
# values whose sums involve at most ~100 terms (measured: at most 4e-7 of the
# model-wide scale), so 1e-5 relative (plus 3e-6 of
# the model-wide scale for entries that cancel) is tight but robust.
#
# bfloat16: parameters and activations are stored in bfloat16 (8 significant
# bits, unit roundoff 2**-9 = 2e-3). A backward pass rounds every activation
# gradient and weight gradient to bfloat16 once per op, about 8 ops deep here,
# and the split path rounds each microbatch's weight gradient separately and
# backpropagates raw (un-normalised) losses, so its roundings fall on
# different values than the monolithic path's. Independent errors of 2e-3
# over ~8 roundings give a few 1e-3 to 1e-2 relative (measured: up to 1.0e-2
# of the model-wide scale for gradients, 3e-3 for norms); we allow 3e-2 relative
# plus 3e-2 of the model-wide scale (entries near zero after cancellation
# carry absolute, not relative, error). The reference comparison adds the
# float64 vs float32 softmax differences, which are far below that.
TOLERANCES = {
    torch.float32: {"split_vs_monolithic": (1e-5, 3e-6), "vs_reference": (1e-4, 1e-5)},
    torch.bfloat16: {"split_vs_monolithic": (3e-2, 3e-2), "vs_reference": (3e-2, 3e-2)},
}


def check_parity(
    layout: Layout,
    config: CotrainConfig,
    scenario: str,
    num_microbatches: int,
    seed: int = 0,
    *,
    seq_len: int = SEQ_LEN,
) -> dict[str, float]:
    """The parity property: split == monolithic == float64 reference (of the unsharded sequence), on every rank.

    Returns the worst errors seen, relative to the model-wide scale (for reports).
    """
    results, global_batch = run_modes(layout, config, scenario, num_microbatches, seed=seed, seq_len=seq_len)
    mono, split = results["monolithic"], results["split"]
    for mode, per_rank in results.items():
        check_ranks_agree(layout, per_rank, mode)
        assert not per_rank[0].skipped, f"{mode}: the step was skipped (non-finite grad norm)"
    tol = TOLERANCES[config.dtype]
    rtol, atol = tol["split_vs_monolithic"]
    worst = {}
    errors = check_against(
        layout,
        split,
        lambda rank: mono[rank],
        rtol=rtol,
        atol_fraction=atol,
        what="split vs monolithic",
        tp_sharded_expected=False,
    )
    worst |= {f"split_vs_monolithic:{k}": v for k, v in errors.items()}
    ref = reference_of(config, global_batch)
    rtol, atol = tol["vs_reference"]
    for mode, per_rank in results.items():
        errors = check_against(
            layout,
            per_rank,
            lambda rank: ref,
            rtol=rtol,
            atol_fraction=atol,
            what=f"{mode} vs float64 reference",
            tp_sharded_expected=True,
        )
        worst |= {f"{mode}_vs_reference:{k}": v for k, v in errors.items()}
    return worst


def config_for(dtype: torch.dtype = torch.float32, **overrides) -> CotrainConfig:
    return replace(CotrainConfig(dtype=dtype), **overrides)
