"""Memory statistics on emulated devices (simdist/_cuda/memory.py).

The expected counts are the CUDA caching allocator's rule, computed here
from each tensor's size: a storage holds ceil(nbytes / 512) blocks of 512
bytes, counted for the process (here: the rank) and device that made it,
until it dies. The gpu-marked twin runs the same program on a real GPU.
"""

from __future__ import annotations

import gc

import pytest
import torch

import simdist

BLOCK = 512


def _blocks(numel: int, dtype: torch.dtype = torch.float32) -> int:
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return -(-nbytes // BLOCK) * BLOCK


def _run(body, world_size: int = 2, **options):
    return simdist.run(body, world_size=world_size, cuda="emulate", **options)


def _allocations_and_frees(ctx_rank: int) -> list[int]:
    """What memory_allocated reads along a program; the same on a GPU."""
    seen = []
    base = torch.cuda.memory_allocated()
    a = torch.zeros(1000 * (ctx_rank + 1), device="cuda")
    seen.append(torch.cuda.memory_allocated() - base)
    b = torch.ones(3, dtype=torch.float64, device="cuda")
    seen.append(torch.cuda.memory_allocated() - base)
    view = a[10:]  # a view: no new memory
    c = a + 1  # an op's result: new memory
    seen.append(torch.cuda.memory_allocated() - base)
    del a, view
    seen.append(torch.cuda.memory_allocated() - base)  # a's storage lives on in... nothing: freed
    seen.append(torch.cuda.max_memory_allocated() - base)
    del b, c
    seen.append(torch.cuda.memory_allocated() - base)
    return seen


def _expected(rank: int) -> list[int]:
    a, b = _blocks(1000 * (rank + 1)), _blocks(3, torch.float64)
    return [a, a + b, 2 * a + b, a + b, 2 * a + b, 0]


def test_each_rank_counts_its_own_allocations_in_the_allocators_blocks() -> None:
    out = _run(lambda ctx: _allocations_and_frees(ctx.rank), world_size=3)
    assert out == [_expected(rank) for rank in range(3)]


def test_peaks_reset_and_the_cache_is_modelled() -> None:
    def body(ctx):
        x = torch.empty(4096, device="cuda")  # 16 KiB
        y = torch.empty(1024, device="cuda")  # 4 KiB
        peak = torch.cuda.max_memory_allocated()
        del x
        after_free = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), torch.cuda.mem_get_info())
        torch.cuda.reset_peak_memory_stats()
        reset = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()
        emptied = torch.cuda.memory_reserved()
        stats = torch.cuda.memory_stats()
        del y
        return peak, after_free, reset, emptied, stats

    for peak, (allocated, reserved, (free, total)), reset, emptied, stats in _run(body):
        assert peak == 16384 + 4096
        assert allocated == 4096 and reserved == 16384 + 4096  # freed blocks stay cached
        assert total == simdist._cuda.device_api.PROPERTIES.total_memory and free == total - reserved
        assert reset == 4096
        assert emptied == 4096  # empty_cache gives back what no tensor holds
        assert stats["allocated_bytes.all.current"] == 4096
        assert stats["allocated_bytes.all.peak"] == 4096
        assert stats["reserved_bytes.all.current"] == 4096
        assert stats["allocation.all.current"] == 1 and stats["num_ooms"] == 0


def test_counts_are_per_device_and_moves_count_once() -> None:
    def body(ctx):
        x = torch.zeros(256, device="cuda:1")  # 1 KiB on device 1
        y = x.cuda(1)  # already there: no copy
        z = x.to("cuda:0")  # a copy on device 0
        w = z.cuda()  # on the current device (0 for rank 0) already
        return (
            torch.cuda.memory_allocated(0),
            torch.cuda.memory_allocated(1),
            torch.cuda.memory_allocated("cuda:1"),
            y is x,
            w is z,
        )

    out = _run(body, world_size=1, cuda_devices=2)
    assert out == [(1024, 1024, 1024, True, True)]


def test_a_storage_resized_in_place_changes_the_count() -> None:
    # FSDP2 frees and re-allocates its unsharded parameters this way.
    def body(ctx):
        x = torch.zeros(1024, device="cuda")
        before = torch.cuda.memory_allocated()
        x.untyped_storage().resize_(0)
        freed = torch.cuda.memory_allocated()
        x.untyped_storage().resize_(4096 * 4)
        grown = torch.cuda.memory_allocated()
        return before, freed, grown

    assert _run(body, world_size=1) == [(4096, 0, 16384)]


def test_a_tensor_returned_from_a_run_does_not_count_in_the_next_run() -> None:
    # A tensor returned from a run dies later, outside any rank: no error,
    # and the next run starts from nothing.
    kept = _run(lambda ctx: torch.ones(100, device="cuda"), world_size=2)
    again = _run(lambda ctx: torch.cuda.memory_allocated(), world_size=2)
    del kept
    gc.collect()
    assert again == [0, 0]


def test_memory_tracking_code_reads_per_rank_figures() -> None:
    # The shape of Megatron's report_memory: allocated, peak, reserved in MB.
    def body(ctx):
        blocks = [torch.empty(2**18 * (ctx.rank + 1), device="cuda") for _ in range(2)]
        mega = 1024 * 1024
        report = (
            torch.cuda.memory_allocated() / mega,
            torch.cuda.max_memory_allocated() / mega,
            torch.cuda.memory_reserved() / mega,
        )
        del blocks
        return report

    assert _run(body) == [(2.0, 2.0, 2.0), (4.0, 4.0, 4.0)]


def test_outside_an_emulating_run_torchs_own_functions_answer() -> None:
    own = torch.cuda.memory_allocated
    _run(lambda ctx: torch.cuda.memory_allocated())
    assert torch.cuda.memory_allocated is own
    seen = simdist.run(lambda ctx: torch.cuda.memory_allocated is own, world_size=1)
    assert seen == [True]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_gpu_counts_as_the_emulation_does() -> None:
    torch.cuda.synchronize()
    assert _allocations_and_frees(0) == _expected(0)


# ------------------------------------------------------------ adversarial uses


def test_a_helper_thread_allocates_for_its_rank() -> None:
    import threading

    def body(ctx):
        made = []
        worker = threading.Thread(target=lambda: made.append(torch.empty(1024, device="cuda")))
        worker.start()
        worker.join()
        return torch.cuda.memory_allocated()

    assert _run(body) == [4096, 4096]


def test_a_tensor_handed_to_a_peer_and_freed_there_counts_back_on_its_maker() -> None:
    shared: dict[int, torch.Tensor] = {}

    def body(ctx):
        import torch.distributed as dist

        if ctx.rank == 0:
            shared[0] = torch.empty(1024, device="cuda")
        held = torch.cuda.memory_allocated()
        dist.barrier()
        if ctx.rank == 1:
            del shared[0]  # rank 1 drops rank 0's tensor: rank 0's memory is freed
        dist.barrier()
        return held, torch.cuda.memory_allocated()

    assert _run(body) == [(4096, 0), (0, 0)]


def test_a_caught_free_error_does_not_come_back() -> None:
    from simdist.errors import AsyncRaceError

    def body(ctx):
        side = torch.cuda.Stream()
        x = torch.ones(4, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = x * 2
        del x  # freed while side reads it, no record_stream
        try:
            z = y + 1  # the next kernel reports it
        except AsyncRaceError as caught:
            reported = "was freed at" in str(caught)
        torch.cuda.current_stream().wait_stream(side)
        z = y + 1  # the program goes on: reported once
        return reported, float(z.sum())

    assert _run(body) == [(True, 12.0), (True, 12.0)]


def test_without_the_sanitizer_frees_are_not_checked_but_still_counted() -> None:
    def body(ctx):
        side = torch.cuda.Stream()
        x = torch.ones(1024, device="cuda")
        with torch.cuda.stream(side):
            y = x * 2
        del x
        return torch.cuda.memory_allocated(), float(y.sum())

    assert _run(body, check_async=False) == [(4096, 2048.0)] * 2


def test_a_run_after_a_failed_run_starts_from_nothing() -> None:
    def failing(ctx):
        kept = torch.empty(4096, device="cuda")  # noqa: F841  # held when the rank fails
        raise ValueError("planted")

    with pytest.raises(simdist.RankError, match="planted"):
        _run(failing)
    assert _run(lambda ctx: torch.cuda.memory_allocated()) == [0, 0]


def test_a_device_the_node_does_not_have_is_refused_as_on_a_gpu() -> None:
    def body(ctx):
        refused = []
        for bad, error, words in [
            (5, RuntimeError, "invalid device ordinal"),
            ("cuda:2", RuntimeError, "invalid device ordinal"),
            ("cpu", ValueError, "Expected a cuda device"),
        ]:
            with pytest.raises(error, match=words):
                torch.cuda.memory_allocated(bad)
            refused.append(bad)
        return refused

    assert _run(body, cuda_devices=2) == [[5, "cuda:2", "cpu"]] * 2
