"""CUDA checks for cluster nodes: ``pytest -m gpu`` (skipped where CUDA is missing).

The same SPMD programs as the gloo differential suite run on simdist with CUDA
tensors, and on a real NCCL world of one process per GPU; the soft
cross-entropy and a collective inside backward run on CUDA under simdist TP
and are compared with float64 references on the CPU. The device-generic tests
also run on the CPU everywhere, so their own logic is checked without a GPU.
"""

from __future__ import annotations

from typing import Any

import diff_worlds
import pytest
import spmd_programs
import torch
import torch.distributed as dist
from diff_compare import compare
from soft_ce_reference import reference_stats
from test_differential_gloo import PROGRAM_NAMES, SEED, differences
from test_mutants_caught import CATCHING

import simdist
from draft_loss import soft_cross_entropy
from simdist import Layout
from simdist.launch import run_processes

TIMEOUT_S = 180.0
# NCCL has no bitwise reductions (BAND/BOR/BXOR), which all_reduce_int covers.
NCCL_PROGRAMS = [name for name in PROGRAM_NAMES if name != "all_reduce_int"]
# "emulated": CUDA tensors on simdist's emulated devices (cuda="emulate"), so
# the CUDA paths of these tests run everywhere; "cuda" needs a GPU.
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("emulated")]


def _on(device: str) -> dict[str, Any]:
    """simdist.run's options for one of DEVICES."""
    return {"device": "cuda", "cuda": "emulate"} if device == "emulated" else {"device": device}


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _cpu(obj: Any) -> Any:
    """Results with every tensor moved to the CPU (simdist returns them where they live)."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu(v) for v in obj)
    return obj


def _assert_same(
    expected: list[dict[str, Any]], actual: list[dict[str, Any]], what: str, names: list[str] = PROGRAM_NAMES
) -> None:
    found = [
        d
        for rank in range(len(expected))
        for name in names
        for d in differences(expected[rank][name], actual[rank][name], f"rank {rank}: {name}")
    ]
    assert not found, f"{len(found)} differences ({what}):\n" + "\n".join(found[:40])


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu), pytest.param("emulated")])
@pytest.mark.parametrize("layout", [Layout(tp=2, dp=2), Layout(tp=2, pp=2), Layout(pp=3)], ids=str)
def test_simdist_on_cuda_matches_simdist_on_cpu(layout: Layout, device: str) -> None:
    def run(device):
        return _cpu(
            simdist.run(
                spmd_programs.run_programs,
                layout=layout,
                args=(PROGRAM_NAMES, SEED),
                timeout=TIMEOUT_S,
                **_on(device),
            )
        )

    _assert_same(run("cpu"), run(device), f"{layout}: cpu vs {device}")


@pytest.mark.gpu
def test_nccl_world_matches_simdist() -> None:
    size = min(_gpus(), 4)
    if size < 2:
        pytest.skip(f"an NCCL world needs at least 2 GPUs, this node has {size}")
    layout = Layout(tp=2, dp=size // 2)
    nccl = run_processes(
        spmd_programs.run_programs,
        layout=layout,
        backend="nccl",
        device="cuda",
        args=(NCCL_PROGRAMS, SEED),
        timeout=TIMEOUT_S,
    )
    sim = _cpu(
        simdist.run(
            spmd_programs.run_programs,
            layout=layout,
            device="cuda",
            args=(NCCL_PROGRAMS, SEED),
            timeout=TIMEOUT_S,
        )
    )
    _assert_same(nccl, sim, f"{layout}: nccl vs simdist", NCCL_PROGRAMS)


def _soft_ce_rank(
    ctx: simdist.RankContext, student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    tp, size = ctx.coords.tp, ctx.layout.tp  # type: ignore[union-attr]
    shard = student.shape[-1] // size
    local = slice(tp * shard, (tp + 1) * shard)
    s = student[..., local].to(ctx.device).requires_grad_(True)
    z = teacher[..., local].to(ctx.device)
    stats = soft_cross_entropy(s, z, mask.to(ctx.device), tp_group=ctx.groups.tp, token_chunk_size=chunk)
    stats.numerators.sum().backward()
    return stats.numerators.detach().cpu(), s.grad.cpu()  # type: ignore[union-attr]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk", [5, 64], ids=["streaming", "cached"])
def test_soft_cross_entropy_under_tp(chunk: int, device: str) -> None:
    g = torch.Generator().manual_seed(3)
    student = torch.randn(2, 6, 32, generator=g, dtype=torch.float32)
    teacher = torch.randn(2, 6, 32, generator=g, dtype=torch.float32)
    mask = (torch.rand(2, 6, generator=g) > 0.3).to(torch.float32)
    results = simdist.run(
        _soft_ce_rank,
        layout=Layout(tp=2),
        args=(student, teacher, mask, chunk),
        timeout=TIMEOUT_S,
        **_on(device),
    )
    s64 = student.double().requires_grad_(True)
    expected = reference_stats(s64, teacher.double(), mask.double()).numerators
    expected.sum().backward()
    for tp, (numerators, grad) in enumerate(results):
        torch.testing.assert_close(numerators.double(), expected.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            grad.double(), s64.grad[..., tp * 16 : (tp + 1) * 16], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("device", DEVICES)
def test_collectives_inside_backward(device: str) -> None:
    class SumOverTP(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
            ctx.group = group
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            grad = grad.clone()
            dist.all_reduce(grad, group=ctx.group)  # runs on the rank's own thread
            return grad, None

    def body(ctx: simdist.RankContext) -> torch.Tensor:
        x = torch.ones(4, device=ctx.device, requires_grad=True)
        (SumOverTP.apply(x * (ctx.rank + 1), ctx.groups.tp) ** 2).sum().backward()
        return x.grad.cpu()  # type: ignore[union-attr]

    grads = simdist.run(body, layout=Layout(tp=2), timeout=TIMEOUT_S, **_on(device))
    # Rank k (k = 1, 2) computes y = k x with x = 1, so dL/dy = 2 k; backward sums
    # that over both ranks (2 + 4 = 6) and the chain rule multiplies by k.
    for rank, grad in enumerate(grads):
        k = rank + 1
        assert torch.equal(grad, torch.full((4,), 6.0 * k))


# --------------------------------------------------------------------------- #
# The differential campaign's programs on CUDA and NCCL (tests/differential)
# --------------------------------------------------------------------------- #

# Version counters, gradients through saved tensors and work.result() were
# measured against gloo only; NCCL's are not known here, so they are not compared.
NCCL_ASPECTS = ("status", "values", "buffers", "objects", "forward", "grad", "returned")
# NCCL has no bitwise reductions; strided tensors are refused by NCCL ("Tensors
# must be contiguous") for some ops and by simdist for those and the P2P calls,
# and taken by both for the list forms: a program's status could differ by op,
# so only contiguous programs are compared.
DIFFERENTIAL_PROGRAMS = {
    name: program
    for name, program in CATCHING.items()
    if not any(s["red"] in ("BAND", "BOR", "BXOR") or s["view"] != "contig" for s in program.steps)
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(DIFFERENTIAL_PROGRAMS))
def test_differential_program_on_simdist_device(name: str, device: str) -> None:
    """simdist gives the same outcome for the program with CUDA tensors as with CPU ones."""
    program = DIFFERENTIAL_PROGRAMS[name]
    on_cpu = diff_worlds.run_simdist(program)
    on_device = diff_worlds.run_simdist(program, **_on(device))
    found = compare(program, on_cpu, on_device)
    assert not found, "\n".join(str(d) for d in found)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(DIFFERENTIAL_PROGRAMS))
def test_differential_program_on_nccl(name: str) -> None:
    program = DIFFERENTIAL_PROGRAMS[name]
    if _gpus() < program.world:
        pytest.skip(f"{program.world} NCCL ranks need {program.world} GPUs, this node has {_gpus()}")
    nccl = diff_worlds.run_cold(program, backend="nccl", device="cuda", timeout=TIMEOUT_S)
    sim = diff_worlds.run_simdist(program, device="cuda")
    found = [d for d in compare(program, nccl, sim) if d.aspect in NCCL_ASPECTS]
    assert not found, f"{program}:\n" + "\n".join(str(d) for d in found)
