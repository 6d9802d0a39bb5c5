"""Megatron-core, unmodified (a test extra: ``pip install megatron-core``).

Megatron keeps its process groups in module globals; simdist makes
``megatron.core.parallel_state`` (and the model-parallel RNG tracker) rank-local
by default, so ``initialize_model_parallel`` runs on every rank as on a cluster.
Checked against ``Layout.group_ranks`` (same rank order) and float64
single-process references.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import simdist
from simdist import Layout


@pytest.fixture(autouse=True)
def megatron() -> None:
    """Imported by the tests that need it, not at collection: importing Megatron
    costs seconds, and once imported its globals are swapped at every switch of
    every later run in the process (see simdist/rank_local_defaults.py)."""
    pytest.importorskip(
        "megatron.core.parallel_state",
        reason="megatron-core is not installed (pip install megatron-core, or the [test] extra)",
    )


def _ps():
    from megatron.core import parallel_state

    return parallel_state


GETTERS = {
    "tp": lambda: _ps().get_tensor_model_parallel_group(),
    "cp": lambda: _ps().get_context_parallel_group(),
    "dp": lambda: _ps().get_data_parallel_group(),
    "pp": lambda: _ps().get_pipeline_model_parallel_group(),
    "dp_cp": lambda: _ps().get_data_parallel_group(with_context_parallel=True),
    "mp": lambda: _ps().get_model_parallel_group(),
}
RANK_GETTERS = {
    "tp": lambda: _ps().get_tensor_model_parallel_rank(),
    "cp": lambda: _ps().get_context_parallel_rank(),
    "dp": lambda: _ps().get_data_parallel_rank(),
    "pp": lambda: _ps().get_pipeline_model_parallel_rank(),
}


def init_body(ctx: simdist.RankContext) -> tuple[dict, dict]:
    layout = ctx.layout
    _ps().initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
    )
    groups = {axis: dist.get_process_group_ranks(get()) for axis, get in GETTERS.items()}
    dist.barrier()  # every rank has initialised: a shared global would show here
    groups_after = {axis: dist.get_process_group_ranks(get()) for axis, get in GETTERS.items()}
    assert groups == groups_after
    return groups, {axis: get() for axis, get in RANK_GETTERS.items()}


@pytest.mark.parametrize(
    "layout",
    [Layout(tp=2, dp=2, pp=2), Layout(tp=2, cp=2, pp=2), Layout(cp=2, dp=2), Layout(tp=4, dp=2)],
    ids=str,
)
@pytest.mark.parametrize("schedule", ["rank", "random"])
def test_initialize_model_parallel_groups_equal_the_layout(layout: Layout, schedule: str) -> None:
    assert not _ps().model_parallel_is_initialized()
    results = simdist.run(init_body, layout=layout, schedule=schedule, schedule_seed=1)
    for rank, (groups, ranks) in enumerate(results):
        assert groups == {axis: layout.group_of(axis, rank) for axis in GETTERS}, rank
        coords = layout.coords(rank)
        assert ranks == {"tp": coords.tp, "cp": coords.cp, "dp": coords.dp, "pp": coords.pp}
    assert not _ps().model_parallel_is_initialized(), "the caller's (uninitialised) globals are back"


SEQ, BATCH, VOCAB = 3, 2, 16


def logits_and_target() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(21)
    return (
        torch.randn(SEQ, BATCH, VOCAB, generator=gen, dtype=torch.float64) * 3,
        torch.randint(VOCAB, (SEQ, BATCH), generator=gen),
    )


def cross_entropy_body(
    ctx: simdist.RankContext, tp: int, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, str]:
    from megatron.core import tensor_parallel

    _ps().initialize_model_parallel(tensor_model_parallel_size=tp)
    logits, target = logits_and_target()
    shard = VOCAB // tp
    # Megatron computes in float32 (it upcasts whatever it gets): feed float32 logits.
    mine = logits[..., ctx.rank * shard : (ctx.rank + 1) * shard].float().to(device).requires_grad_()
    loss = tensor_parallel.vocab_parallel_cross_entropy(mine, target.to(device))
    weights = torch.arange(1, loss.numel() + 1, dtype=loss.dtype, device=device).view(loss.shape)
    (loss * weights).sum().backward()
    return loss.detach().cpu(), mine.grad.cpu(), f"{loss.device} {mine.grad.device}"


@pytest.mark.parametrize("cuda", ["off", "emulate"])
@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_parallel_cross_entropy_equals_float64(tp: int, cuda: str) -> None:
    """On CPU tensors, and (cuda='emulate') on CUDA ones as a GPU user writes it:
    Megatron's cross entropy itself unmodified, its NCCL groups emulated."""
    logits, target = logits_and_target()
    logits = logits.float().double().requires_grad_()  # the float32 inputs, in float64
    want = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(SEQ, BATCH)
    (want * torch.arange(1, want.numel() + 1, dtype=want.dtype).view(want.shape)).sum().backward()
    shard = VOCAB // tp
    device = "cuda" if cuda == "emulate" else "cpu"
    options = {"cuda": "emulate"} if cuda == "emulate" else {}
    results = simdist.run(cross_entropy_body, world_size=tp, args=(tp, device), **options)
    for rank, (loss, grad, devices) in enumerate(results):
        assert devices == (f"cuda:{rank} cuda:{rank}" if cuda == "emulate" else "cpu cpu")
        torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(
            grad.double(), logits.grad[..., rank * shard : (rank + 1) * shard], rtol=1e-6, atol=1e-6
        )


HIDDEN, FFN, TOKENS = 6, 8, 8


def seeded_init(weight: torch.Tensor) -> None:
    """Megatron calls this on the full (master) weight on every rank, then keeps its slice."""
    gen = torch.Generator().manual_seed(weight.shape[0])
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=gen) * 0.5)


def tokens() -> torch.Tensor:
    return torch.randn(TOKENS, BATCH, HIDDEN, generator=torch.Generator().manual_seed(8), dtype=torch.float64)


def mlp_body(ctx: simdist.RankContext, tp: int, sequence_parallel: bool) -> tuple:
    from megatron.core import tensor_parallel
    from megatron.core.model_parallel_config import ModelParallelConfig

    _ps().initialize_model_parallel(tensor_model_parallel_size=tp)
    cfg = ModelParallelConfig(
        tensor_model_parallel_size=tp,
        sequence_parallel=sequence_parallel,
        use_cpu_initialization=True,
        params_dtype=torch.float64,
    )
    col = tensor_parallel.ColumnParallelLinear(
        HIDDEN, FFN, config=cfg, init_method=seeded_init, bias=True, gather_output=False
    )
    row = tensor_parallel.RowParallelLinear(
        FFN,
        HIDDEN,
        config=cfg,
        init_method=seeded_init,
        bias=True,
        input_is_parallel=True,
        skip_bias_add=False,
    )
    # use_cpu_initialization builds the weights on the CPU; a GPU job then
    # moves the model (an emulated device refuses the mix as a GPU does).
    col.to(ctx.device)
    row.to(ctx.device)
    x = tokens().to(ctx.device)
    if sequence_parallel:  # the sequence is split over TP ranks before and after the block
        n = TOKENS // tp
        x = x[ctx.rank * n : (ctx.rank + 1) * n]
    x = x.clone().requires_grad_()
    h, _ = col(x)
    y, _ = row(torch.tanh(h))
    (y * y).sum().backward()
    return y.detach().cpu(), x.grad.cpu(), col.weight.grad.cpu(), row.weight.grad.cpu()


def mlp_reference() -> tuple:
    w1 = torch.empty(FFN, HIDDEN)
    w2 = torch.empty(HIDDEN, FFN)
    seeded_init(w1)
    seeded_init(w2)
    w1, w2 = w1.double().requires_grad_(), w2.double().requires_grad_()
    x = tokens().requires_grad_()
    y = torch.tanh(x @ w1.T) @ w2.T  # biases start at zero, as Megatron initialises them
    (y * y).sum().backward()
    return y.detach(), x.grad, w1.grad, w2.grad


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_column_then_row_parallel_linear_equals_float64(tp: int, sequence_parallel: bool) -> None:
    want_y, want_x, want_w1, want_w2 = mlp_reference()
    device = "cuda" if sequence_parallel else "cpu"
    # megatron-core's sequence-parallel path allocates its gather/reduce-scatter
    # buffers on torch.cuda.current_device() (GlobalMemoryBuffer,
    # tensor_parallel.mappings): without a GPU it runs on emulated ones, unmodified.
    emulate = {"cuda": "emulate"} if sequence_parallel and not torch.cuda.is_available() else {}
    results = simdist.run(mlp_body, world_size=tp, args=(tp, sequence_parallel), device=device, **emulate)
    f, n = FFN // tp, TOKENS // tp
    for rank, (y, x_grad, w1_grad, w2_grad) in enumerate(results):
        rows = slice(rank * n, (rank + 1) * n) if sequence_parallel else slice(None)
        torch.testing.assert_close(y, want_y[rows], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x_grad, want_x[rows], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w1_grad, want_w1[rank * f : (rank + 1) * f], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(w2_grad, want_w2[:, rank * f : (rank + 1) * f], rtol=1e-12, atol=1e-12)


LATE_IMPORT = """
import sys, simdist, torch.distributed as dist
assert "megatron.core.parallel_state" not in sys.modules
layout = simdist.Layout(tp=2, dp=2, pp=2)
def body(ctx):
    from megatron.core import parallel_state as ps  # the process's first import, inside rank 0
    ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    return [dist.get_process_group_ranks(g()) for g in (ps.get_tensor_model_parallel_group,
            ps.get_data_parallel_group, ps.get_pipeline_model_parallel_group)]
got = simdist.run(body, layout=layout, timeout=120)
want = [[layout.group_of(a, r) for a in ("tp", "dp", "pp")] for r in range(8)]
from megatron.core import parallel_state as ps
print(got == want, ps.model_parallel_is_initialized())
"""


@pytest.mark.slow
def test_megatron_first_imported_inside_a_rank_is_still_per_rank() -> None:
    """A fresh interpreter (this one has Megatron imported already)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", LATE_IMPORT],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["True", "False"], out.stdout


def test_the_documented_recipe_runs_as_written() -> None:
    """examples/megatron/recipe.py, the code docs/clients.md shows: its own checks
    (groups equal the layout's, the layer's output) run inside main()."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "megatron" / "recipe.py"
    spec = importlib.util.spec_from_file_location("megatron_recipe", path)
    assert spec is not None and spec.loader is not None
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    results = recipe.main()
    assert len(results) == recipe.LAYOUT.world_size
    from megatron.core import parallel_state

    assert (
        not parallel_state.model_parallel_is_initialized()
    )  # destroyed in every rank; the caller's untouched


def clip_body(ctx: simdist.RankContext) -> tuple:
    _ps()  # megatron-core present (skips otherwise)
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32, get_grad_norm_fp32

    torch.cuda.set_device(ctx.rank)
    gen = torch.Generator().manual_seed(ctx.rank)
    params = [torch.nn.Parameter(torch.randn(5, generator=gen).cuda()) for _ in range(3)]
    for i, p in enumerate(params):
        p.grad = torch.randn(5, generator=gen).cuda() * (i + 1)
    grads = [p.grad for p in params]
    norm = get_grad_norm_fp32(grads, norm_type=2, grad_stats_parallel_group=ctx.groups.world)
    peak = get_grad_norm_fp32(grads, norm_type=float("inf"), grad_stats_parallel_group=ctx.groups.world)
    clip_grad_by_total_norm_fp32(params, max_norm=1.0, total_norm=norm)
    return norm, peak, [p.grad.cpu() for p in params]


def test_megatron_clip_grads_written_for_cuda_runs_unmodified_on_emulated_devices() -> None:
    """get_grad_norm_fp32 builds its buffers with device='cuda' and the clip
    asserts 'torch.cuda.FloatTensor' gradients: under cuda='emulate' both run
    as written, against a float64 norm of every rank's gradients."""
    world = 2
    grads = []
    for rank in range(world):
        gen = torch.Generator().manual_seed(rank)
        [torch.randn(5, generator=gen) for _ in range(3)]  # the parameters' draws come first
        grads.append([torch.randn(5, generator=gen).double() * (i + 1) for i in range(3)])
    flat = torch.cat([g for rank in grads for g in rank])
    want_norm, want_peak = float(flat.norm()), float(flat.abs().max())
    coefficient = min(1.0, 1.0 / (want_norm + 1e-6))
    results = simdist.run(clip_body, world_size=world, cuda="emulate")
    for rank, (norm, peak, clipped) in enumerate(results):
        assert norm == pytest.approx(want_norm, rel=1e-6) and peak == pytest.approx(want_peak, rel=1e-6)
        for got, grad in zip(clipped, grads[rank]):
            torch.testing.assert_close(got.double(), grad * coefficient, rtol=1e-5, atol=1e-6)
