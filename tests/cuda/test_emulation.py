"""``simdist.run(cuda="emulate")``: CUDA-first code on the CPU (docs/cuda.md).

What is checked against an independent reference: every value an emulated
tensor computes equals the same computation on plain CPU tensors in the
caller's thread, bit for bit; what torch.cuda answers is what a node of that
many GPUs answers (torchrun's LOCAL_RANK device per rank); and mixing devices
raises torch's own error text.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import simdist
from simdist._cuda import EmulatedCudaParameter, EmulatedCudaTensor

EMULATE = {"cuda": "emulate"}


def _run(body, world_size: int = 2, **options):
    return simdist.run(body, world_size=world_size, **{**EMULATE, **options})


# ------------------------------------------------------------ the device API


def test_each_rank_sees_a_node_of_gpus_with_its_local_rank_current() -> None:
    def body(ctx):
        return (
            torch.cuda.is_available(),
            torch.cuda.is_initialized(),
            torch.cuda.device_count(),
            torch.cuda.current_device(),
            torch.cuda.get_device_name(),
            torch.cuda.get_device_capability(),
            torch.cuda.get_device_properties(0).total_memory > 0,
            str(ctx.device),
        )

    out = _run(body, world_size=10, device="cuda")
    for rank, (available, initialised, count, current, name, capability, memory, device) in enumerate(out):
        assert available and initialised and memory
        assert count == 8  # the world, at most 8 a node
        assert current == rank % 8
        assert device == f"cuda:{rank % 8}"
        assert "emulated" in name and capability == (9, 0)


def test_cuda_devices_sets_the_node_size() -> None:
    out = _run(
        lambda ctx: (torch.cuda.device_count(), torch.cuda.current_device()), world_size=4, cuda_devices=2
    )
    assert out == [(2, 0), (2, 1), (2, 0), (2, 1)]


def test_set_device_and_the_device_context_are_per_rank() -> None:
    def body(ctx):
        torch.cuda.set_device(1 - ctx.rank)
        seen = [torch.cuda.current_device()]
        dist.barrier()  # the other rank has set its own by now
        seen.append(torch.cuda.current_device())
        with torch.cuda.device(ctx.rank):
            seen.append(torch.cuda.current_device())
            seen.append(str(torch.zeros(1, device="cuda").device))
        seen.append(torch.cuda.current_device())
        torch.cuda.set_device(torch.device("cuda", 0))
        seen.append(torch.cuda.current_device())
        return seen

    assert _run(body) == [[1, 1, 0, "cuda:0", 1, 0], [0, 0, 1, "cuda:1", 0, 0]]


def test_a_device_the_node_does_not_have_is_refused_as_on_a_gpu() -> None:
    def body(ctx):
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.set_device(2)
        with pytest.raises(ValueError, match="Expected a cuda device"):
            torch.cuda.set_device("cpu")
        return torch.cuda.current_device()

    assert _run(body) == [0, 1]


def test_the_caller_and_runs_without_emulation_see_torchs_own_answers() -> None:
    available = torch.cuda.is_available()
    seen_by_caller: list[bool] = []

    def body(ctx):
        seen_by_caller.append(torch.cuda.is_available())
        return torch.cuda.is_available()

    assert simdist.run(body, world_size=2) == [available, available]
    assert _run(body) == [True, True]
    assert torch.cuda.is_available() is available
    # torch's own functions are back in place once the run is over.
    assert torch.cuda.is_available.__module__ == "torch.cuda"
    assert torch.cuda.device.__module__ == "torch.cuda"


def test_every_place_the_emulation_changes_holds_torchs_own_value_after_runs_that_failed() -> None:
    from simdist._isolation import patches

    before = patches.current_values()

    def body(ctx):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            torch.ones(2, device="cuda").sum().backward()  # no grad: raises inside backward's entry
        return None

    with pytest.raises(simdist.RankError):
        _run(body)
    with pytest.raises(simdist.RankError):
        _run(lambda ctx: 1 / 0)
    assert patches.current_values() == before
    assert torch.amp.autocast_mode.autocast.__enter__.__module__ == "torch.amp.autocast_mode"
    assert dist.is_nccl_available.__module__ == "torch.distributed.distributed_c10d"


def test_a_helper_thread_of_a_rank_sees_its_ranks_device_and_makes_tensors_on_it() -> None:
    def body(ctx):
        torch.cuda.set_device(ctx.rank)
        seen = []

        def helper() -> None:
            made = torch.zeros(1, device="cuda")
            seen.append((torch.cuda.is_available(), torch.cuda.current_device(), str(made.device)))

        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        return seen[0]

    assert _run(body) == [(True, 0, "cuda:0"), (True, 1, "cuda:1")]


def test_bad_options_are_refused_before_any_rank_starts() -> None:
    with pytest.raises(ValueError, match="cuda must be None"):
        simdist.run(lambda ctx: None, world_size=2, cuda="yes")
    with pytest.raises(ValueError, match="needs cuda='emulate'"):
        simdist.run(lambda ctx: None, world_size=2, cuda_devices=2)
    with pytest.raises(ValueError, match="cuda_devices"):
        simdist.run(lambda ctx: None, world_size=2, cuda="emulate", cuda_devices=0)


# ------------------------------------------------------------- the tensors


def test_factories_and_moves_name_the_emulated_device() -> None:
    def body(ctx):
        made = {
            "zeros": torch.zeros(2, device="cuda"),
            "index": torch.ones(2, device=1),
            "named": torch.empty(2, device="cuda:1"),
            "device object": torch.arange(3, device=torch.device("cuda")),
            "tensor": torch.tensor([1.0, 2.0], device="cuda"),
            "cuda()": torch.ones(2).cuda(),
            "cuda(1)": torch.ones(2).cuda(1),
            "to": torch.ones(2).to("cuda"),
            "to with dtype": torch.ones(2).to("cuda", torch.float64),
            "like": torch.zeros_like(torch.ones(2, device="cuda")),
            "new": torch.ones(2, device="cuda").new_zeros(3),
            "result": torch.ones(2, device="cuda") * 2 + 1,
        }
        torch.set_default_device("cuda")
        try:
            made["default device"] = torch.ones(2)
            # A factory given an emulated tensor under the default device.
            made["as_tensor, default device"] = torch.as_tensor(made["zeros"])
        finally:
            torch.set_default_device(None)
        return {name: (str(t.device), t.is_cuda, type(t).__name__) for name, t in made.items()}

    rank1 = _run(body)[1]
    named = {"index": "cuda:1", "named": "cuda:1", "cuda(1)": "cuda:1"}
    for name, (device, is_cuda, kind) in rank1.items():
        assert device == named.get(name, "cuda:1"), name  # rank 1's current device is 1
        assert is_cuda and kind == "EmulatedCudaTensor", name


def test_emulated_values_are_the_cpus_bit_for_bit() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(5, 7), torch.randn(7, 3)

    def reference() -> torch.Tensor:
        return torch.softmax(torch.tanh(a @ b) * 3.0, dim=-1).cumsum(0)

    def body(ctx, a, b):
        out = torch.softmax(torch.tanh(a.cuda() @ b.to("cuda")) * 3.0, dim=-1).cumsum(0)
        assert out.is_cuda
        return out.cpu()

    expected = reference()
    for result in _run(body, args=(a, b)):
        assert type(result) is torch.Tensor and result.device.type == "cpu"
        assert torch.equal(result, expected)


def test_cpu_is_a_copy_and_numpy_is_refused_as_on_a_gpu() -> None:
    def body(ctx):
        x = torch.ones(3, device="cuda")
        host = x.cpu()
        host += 1  # a device-to-host copy: the device tensor is untouched
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            x.numpy()
        same = x.to("cuda")
        return x.tolist(), host.tolist(), same is x, x.get_device(), x.type()

    assert _run(body, world_size=1) == [([1.0] * 3, [2.0] * 3, True, 0, "torch.cuda.FloatTensor")]


def test_mixing_devices_raises_torchs_own_error() -> None:
    def body(ctx):
        x = torch.ones(3, device="cuda:0")
        with pytest.raises(
            RuntimeError, match=r"Expected all tensors to be on the same device.*cuda:0 and cpu"
        ):
            x + torch.ones(3)
        with pytest.raises(
            RuntimeError, match=r"Expected all tensors to be on the same device.*cuda:0 and cuda:1"
        ):
            x + torch.ones(3, device="cuda:1")
        # As on a GPU: CPU scalars, cross-device copies and CPU indices are fine.
        y = x * torch.tensor(2.0)
        y.copy_(torch.arange(3.0))
        picked = y[torch.tensor([0, 2])]
        return y.tolist(), picked.tolist(), str(picked.device)

    assert _run(body, world_size=1, cuda_devices=2) == [([0.0, 1.0, 2.0], [0.0, 2.0], "cuda:0")]


def test_a_module_moved_to_cuda_trains_as_on_the_cpu() -> None:
    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    torch.manual_seed(1)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(6, 4)

    def body(ctx, model, x):
        params = list(model.parameters())
        model.cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            step(model, opt, x.cuda())
        moved = [p for p in model.parameters()]
        assert all(a is b for a, b in zip(params, moved))  # moved in place, as .cuda() does
        assert all(type(p) is EmulatedCudaParameter and isinstance(p, torch.nn.Parameter) for p in moved)
        assert all(str(p.grad.device) == f"cuda:{ctx.rank}" for p in moved)
        model.cpu()
        assert all(type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in moved)
        return [p.detach().clone() for p in model.parameters()]

    results = _run(body, args=(reference, x))
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        step(reference, opt, x)
    for params in results:
        for got, want in zip(params, reference.parameters()):
            assert torch.equal(got, want.detach())


def test_collectives_on_emulated_tensors_give_the_cpu_results_on_the_device() -> None:
    def body(ctx):
        rank = ctx.rank
        x = torch.arange(4.0, device="cuda") + rank
        dist.all_reduce(x)
        gathered = [torch.empty(2, device="cuda") for _ in range(ctx.world_size)]
        dist.all_gather(gathered, torch.full((2,), float(rank), device="cuda"))
        b = torch.full((3,), float(rank), device="cuda")
        dist.broadcast(b, src=1)
        devices = {str(t.device) for t in (x, b, *gathered)}
        return x.cpu(), torch.cat(gathered).cpu(), b.cpu(), devices

    world = 3
    for rank, (x, gathered, b, devices) in enumerate(_run(body, world_size=world)):
        assert torch.equal(x, sum(torch.arange(4.0) + r for r in range(world)))
        assert torch.equal(gathered, torch.tensor([0.0, 0, 1, 1, 2, 2]))
        assert torch.equal(b, torch.ones(3))
        assert devices == {f"cuda:{rank}"}


def test_emulated_tensors_returned_from_a_run_still_report_their_device() -> None:
    (out,) = _run(lambda ctx: torch.ones(2, device="cuda") * 3, world_size=1)
    assert isinstance(out, EmulatedCudaTensor) and str(out.device) == "cuda:0"
    assert out.cpu().tolist() == [3.0, 3.0]


def test_without_emulation_cuda_tensors_fail_as_torch_fails() -> None:
    if torch.cuda.is_available():
        pytest.skip("a real GPU is here")

    def body(ctx):
        with pytest.raises((AssertionError, RuntimeError), match="CUDA"):
            torch.zeros(1, device="cuda")
        return torch.cuda.is_available()

    assert simdist.run(body, world_size=1) == [False]


@pytest.mark.simdist(world_size=2, cuda="emulate", cuda_devices=1)
def test_the_marker_takes_the_option(ctx) -> None:
    assert torch.cuda.device_count() == 1 and torch.cuda.current_device() == 0
    t = torch.full((2,), float(ctx.rank), device="cuda")
    dist.all_reduce(t)
    assert t.is_cuda and t.tolist() == [1.0, 1.0]


def test_autograd_sees_the_cpus_graph_leaves_and_all() -> None:
    def body(ctx):
        # Drawn on the CPU (a CUDA draw comes from the device's own generator).
        w = torch.randn(3).cuda().requires_grad_()
        y = (w * 2).exp().sum()
        y.backward()
        return w.is_leaf, y.grad_fn.name(), (w * 2).grad_fn.name(), str(w.grad.device), w.grad.cpu()

    torch.manual_seed(0)  # the rank's generator starts from the caller's state
    w = torch.randn(3, requires_grad=True)
    y = (w * 2).exp().sum()
    y.backward()
    torch.manual_seed(0)
    (leaf, name, mul, grad_device, grad) = _run(body, world_size=1)[0]
    assert leaf and name == y.grad_fn.name() and mul == "MulBackward0" and grad_device == "cuda:0"
    assert torch.equal(grad, w.grad)


def test_printing_copying_and_saving_keep_the_device() -> None:
    def body(ctx):
        import copy
        import io

        x = torch.arange(6.0).reshape(2, 3).cuda(1)
        model = torch.nn.Linear(2, 2).cuda(1)
        buffer = io.BytesIO()
        torch.save({"x": x, "model": model.state_dict()}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer)
        twin = copy.deepcopy(model)
        return (
            repr(x),
            str(loaded["x"].device),
            torch.equal(loaded["x"].cpu(), x.cpu()),
            str(loaded["model"]["weight"].device),
            str(twin.weight.device),
            twin.weight is not model.weight and isinstance(twin.weight, torch.nn.Parameter),
            f"{x.sum():.1f}",
        )

    out = _run(body, world_size=1, cuda_devices=2)[0]
    assert out[0] == repr(torch.arange(6.0).reshape(2, 3))[:-1] + ", device='cuda:1')"
    assert out[1:] == ("cuda:1", True, "cuda:1", "cuda:1", True, "15.0")


# ----------------------------------------------------- streams and events


def test_streams_and_events_answer_as_on_a_gpu_whose_work_is_done() -> None:
    def body(ctx):
        main = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        assert isinstance(side, torch.cuda.Stream) and main == torch.cuda.default_stream()
        x = torch.ones(4, device="cuda")
        side.wait_stream(main)
        with torch.cuda.stream(side):
            inside = torch.cuda.current_stream()
            y = x * 2
            done = side.record_event()
        x.record_stream(side)
        main.wait_event(done)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        end.synchronize()
        return (
            inside == side,
            torch.cuda.current_stream() == main,
            done.query() and side.query(),
            start.elapsed_time(end) >= 0.0,
            y.tolist(),
            str(side.device),
        )

    for rank, out in enumerate(_run(body)):
        assert out == (True, True, True, True, [2.0] * 4, f"cuda:{rank}")


def test_each_rank_has_its_own_current_stream() -> None:
    def body(ctx):
        mine = torch.cuda.Stream()
        torch.cuda.set_stream(mine)
        dist.barrier()  # the other rank set its own meanwhile
        return torch.cuda.current_stream() == mine

    assert _run(body) == [True, True]


# ------------------------------------------------- clients written for CUDA


def _cpu_and_emulated(body, world_size: int = 2):
    emulated = _run(body, world_size=world_size, args=("cuda",))
    on_cpu = simdist.run(body, world_size=world_size, args=("cpu",))
    return emulated, on_cpu


def test_a_cuda_first_ddp_client_runs_unmodified_and_matches_the_cpu() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    def body(ctx, device):
        if device == "cuda":
            torch.cuda.set_device(ctx.rank)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(device)
        ids = [torch.cuda.current_device()] if device == "cuda" else None
        ddp = DDP(model, device_ids=ids)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(2):
            # Drawn on the CPU, then moved: the same data in both programs.
            x = torch.randn(3, 4).to(device) * (ctx.rank + 1 + step)
            opt.zero_grad()
            ddp(x).pow(2).sum().backward()
            opt.step()
        return [str(p.device) for p in model.parameters()], [p.detach().cpu() for p in model.parameters()]

    emulated, on_cpu = _cpu_and_emulated(body)
    for rank in range(2):
        assert set(emulated[rank][0]) == {f"cuda:{rank}"}
        assert all(torch.equal(a, b) for a, b in zip(emulated[rank][1], on_cpu[rank][1]))


def test_a_cuda_first_fsdp2_client_runs_unmodified_and_matches_the_cpu() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def body(ctx, device):
        if device == "cuda":
            torch.cuda.set_device(ctx.rank)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)).to(device)
        mesh = init_device_mesh(device, (ctx.world_size,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x = torch.randn(3, 4).to(device) * (ctx.rank + 1)  # drawn on the CPU in both programs
        model(x).sum().backward()
        local = {str(p.to_local().device) for p in model.parameters()}
        return local, [p.grad.full_tensor().cpu() for p in model.parameters()]

    emulated, on_cpu = _cpu_and_emulated(body)
    for rank in range(2):
        assert emulated[rank][0] == {f"cuda:{rank}"}
        assert all(torch.equal(a, b) for a, b in zip(emulated[rank][1], on_cpu[rank][1]))


def test_tensors_torch_makes_below_python_are_on_the_device_too() -> None:
    def body(ctx):
        made = torch.ops.aten.empty.memory_format([2], device=torch.device("cuda"))
        x = torch.ones(3, device="cuda")
        derived = torch.ops.aten.mul.Tensor(x, 2)  # an aten call, as torch's own Python layers make them
        host = torch.ops.aten._to_copy.default(x, device=torch.device("cpu"))
        return str(made.device), str(derived.device), str(host.device), type(host) is torch.Tensor

    assert _run(body) == [("cuda:0", "cuda:0", "cpu", True), ("cuda:1", "cuda:1", "cpu", True)]


def test_backward_code_makes_tensors_on_the_device_as_forward_code_does() -> None:
    class Doubling(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            # As Megatron's sequence-parallel backward allocates its buffers.
            out = torch.empty(grad.shape, dtype=grad.dtype, device=torch.cuda.current_device())
            out.copy_(grad * 2)
            return out

    def body(ctx):
        x = torch.ones(2, device="cuda", requires_grad=True)
        Doubling.apply(x).sum().backward()
        (grad,) = torch.autograd.grad(Doubling.apply(x).sum(), [x])
        return str(x.grad.device), x.grad.cpu().tolist(), str(grad.device)

    assert _run(body) == [("cuda:0", [2.0, 2.0], "cuda:0"), ("cuda:1", [2.0, 2.0], "cuda:1")]


# ------------------------------------------------------------------ NCCL


def test_code_that_picks_nccl_when_cuda_is_there_gets_an_nccl_group() -> None:
    def body(ctx):
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        group = dist.new_group(backend=backend)
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=group)
        return dist.get_backend(group), dist.is_nccl_available(), t.tolist()

    assert _run(body) == [("nccl", True, [2.0, 2.0])] * 2
    assert dist.is_nccl_available() is torch.distributed.distributed_c10d._NCCL_AVAILABLE  # the caller's own


def test_an_nccl_group_refuses_bitwise_reductions_as_nccl_does() -> None:
    def body(ctx):
        group = dist.new_group(backend="nccl")
        dist.all_reduce(torch.ones(2, dtype=torch.int32, device="cuda"), op=dist.ReduceOp.BAND, group=group)

    with pytest.raises(simdist.RankError) as caught:
        _run(body)
    # simdist's error reaches the program, not c10d's error logger's own failure.
    assert "Cannot use ReduceOp.BAND with NCCL" in str(caught.value)
    assert set(caught.value.failures) == {0, 1}  # every rank, together


# ----------------------------------------------------------------- autocast


def test_autocast_cuda_casts_as_on_a_gpu() -> None:
    """Matmuls in the low precision, softmax and losses in float32 (CUDA's
    lists), values as the CPU computes those dtypes; nothing cast outside."""
    torch.manual_seed(0)
    a = torch.randn(4, 4)

    def body(ctx, a):
        x = a.cuda()
        out = {}
        for dtype in (torch.bfloat16, torch.float16):
            with torch.autocast("cuda", dtype=dtype):
                product = x @ x
                probs = torch.softmax(product, -1)
                loss = torch.nn.functional.cross_entropy(product, torch.tensor([0, 1, 2, 3], device="cuda"))
            out[dtype] = (product.dtype, probs.dtype, loss.dtype, probs.cpu(), product.cpu())
        with torch.autocast("cuda", enabled=False):
            out["off"] = (x @ x).dtype
        out["after"] = (x @ x).dtype
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out["host softmax"] = torch.softmax(a.bfloat16(), -1).dtype  # a CPU op: not CUDA's to cast
        return out

    (out,) = _run(body, world_size=1, args=(a,))
    for dtype in (torch.bfloat16, torch.float16):
        product_dtype, probs_dtype, loss_dtype, probs, product = out[dtype]
        assert (product_dtype, probs_dtype, loss_dtype) == (dtype, torch.float32, torch.float32)
        want = a.to(dtype) @ a.to(dtype)
        assert torch.equal(product, want)
        assert torch.equal(probs, torch.softmax(want.float(), -1))
    assert out["off"] == out["after"] == torch.float32
    assert out["host softmax"] == torch.bfloat16


# --------------------------------------------------------------- generators


def test_cuda_draws_come_from_the_devices_own_generator() -> None:
    def body(ctx):
        torch.manual_seed(1)
        cpu_alone = torch.rand(4)
        torch.manual_seed(1)
        torch.randn(8, device="cuda")  # CUDA draws do not move the CPU generator
        torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5)
        cpu_after_cuda = torch.rand(4)
        torch.cuda.manual_seed(5 + ctx.rank)
        first = torch.randn(3, device="cuda")
        torch.cuda.manual_seed(5 + ctx.rank)
        again = torch.empty(3, device="cuda").normal_()  # an in-place draw, the same stream
        state = torch.cuda.get_rng_state()
        drawn = torch.rand(2, device="cuda")
        torch.cuda.set_rng_state(state)
        redrawn = torch.rand(2, device="cuda")
        return (
            torch.equal(cpu_alone, cpu_after_cuda),
            torch.equal(first, again),
            torch.equal(drawn, redrawn),
            torch.cuda.initial_seed(),
            first.cpu(),
        )

    ranks = _run(body)
    for rank, (cpu_kept, reseeded, restored, seed, _) in enumerate(ranks):
        assert cpu_kept and reseeded and restored and seed == 5 + rank
    # Each rank seeded its own device generator: different seeds, different draws.
    assert not torch.equal(ranks[0][4], ranks[1][4])


def test_what_cannot_be_emulated_is_refused_naming_the_call() -> None:
    from simdist.errors import UnsupportedOperationError

    calls = {
        "CUDAGraph": lambda: torch.cuda.CUDAGraph(),
        "graph": lambda: torch.cuda.graph(None),
        "utilization": lambda: torch.cuda.utilization(),
    }

    def body(ctx):
        seen = {}
        for name, call in calls.items():
            with pytest.raises(
                UnsupportedOperationError, match=f"torch.cuda.{name}: not available"
            ) as caught:
                call()
            seen[name] = "mark it gpu" in str(caught.value)
        return seen

    assert _run(body) == [dict.fromkeys(calls, True)] * 2


def test_gpu_only_compilation_and_kernels_are_refused_naming_the_call() -> None:
    from simdist.errors import UnsupportedOperationError

    lib = torch.library.Library("simdist_cuda_only", "DEF")  # a test-local op library
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CUDA")  # an extension's kernel: CUDA only

    def body(ctx):
        x = torch.ones(4, device="cuda")
        seen = []
        for mode in ("reduce-overhead", "max-autotune"):
            with pytest.raises(UnsupportedOperationError, match=f"torch.compile\\(mode='{mode}'\\)"):
                torch.compile(lambda t: t + 1, mode=mode)
        with pytest.raises(UnsupportedOperationError, match=r"triton\.cudagraphs"):
            torch.compile(lambda t: t + 1, options={"triton.cudagraphs": True})
        with pytest.raises(
            UnsupportedOperationError, match="simdist_cuda_only::double: a CUDA kernel"
        ) as caught:
            torch.ops.simdist_cuda_only.double(x)
        seen.append("mark it gpu" in str(caught.value))
        # The default compiles for the CPU the tensors live on: the program's values.
        compiled = torch.compile(lambda t: t * 2 + 1)(x)
        seen.append((str(compiled.device), compiled.cpu().tolist()))
        return seen

    try:
        assert _run(body, world_size=1) == [[True, ("cuda:0", [3.0] * 4)]]
    finally:
        del lib
    # Outside emulating runs: torch's own torch.compile again.
    assert "simdist" not in getattr(torch.compile, "__module__", "")


def test_a_triton_kernel_is_refused_naming_it() -> None:
    triton = pytest.importorskip("triton")
    import triton.language as tl

    from simdist.errors import UnsupportedOperationError

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    def body(ctx):
        x = torch.ones(8, device="cuda")
        with pytest.raises(UnsupportedOperationError, match=r"a Triton kernel \(add_one\)") as caught:
            add_one[(1,)](x, 8, BLOCK=8)
        return "mark it gpu" in str(caught.value)

    assert _run(body) == [True, True]
    assert "simdist" not in triton.runtime.jit.JITFunction.run.__module__  # Triton's own again


def test_the_docs_page_example_runs_as_written() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "cuda.md").read_text()
    start = page.index("```python\n") + len("```python\n")
    example = page[start : page.index("```", start)]
    namespace: dict = {}
    exec(compile(example, "docs/cuda.md", "exec"), namespace)
    grads = namespace["grads"]
    assert len(grads) == 4 and all(g.device.type == "cpu" and g.shape == (2, 4) for g in grads)
    assert all(torch.equal(g, grads[0]) for g in grads)  # all-reduced: every rank holds the sum
