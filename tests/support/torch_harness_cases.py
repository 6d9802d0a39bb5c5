"""Test classes written the way PyTorch's own distributed tests are, on its
harnesses (reached through simdist.torch_compat.harness, the one place simdist
touches torch.testing._internal). tests/torch_compat/test_harnesses.py runs them with and
without the adapter; they are not collected themselves."""

from __future__ import annotations

import os
import unittest

import torch
import torch.distributed as dist

from simdist.torch_compat import harness

MultiProcessTestCase = harness.MultiProcessTestCase
MultiThreadedTestCase = harness.MultiThreadedTestCase
dtensor = harness.dtensor


class ProcessCases(MultiProcessTestCase):
    """One spawned gloo process per rank, as test_c10d_gloo.py writes them."""

    @property
    def world_size(self) -> int:
        return 3

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _init(self) -> None:
        dist.init_process_group(
            "gloo", init_method=f"file://{self.file_name}", world_size=self.world_size, rank=self.rank
        )

    def test_all_reduce(self) -> None:
        self._init()
        t = torch.full((4,), float(self.rank + 1))
        dist.all_reduce(t)
        self.assertEqual(t, torch.full((4,), 6.0))
        self.assertEqual(dist.get_rank(), self.rank)
        self.assertEqual(dist.get_world_size(), 3)

    def test_skips_on_every_rank(self) -> None:
        self._init()
        raise unittest.SkipTest("not on this machine")

    def test_rank_one_fails(self) -> None:
        self._init()
        dist.barrier()
        if self.rank == 1:
            raise ValueError("rank one's own mistake")

    def test_rank_two_skips_its_collective(self) -> None:
        self._init()
        if self.rank != 2:
            dist.all_reduce(torch.ones(2))

    def test_seeded_by_the_harness(self) -> None:
        # run_test seeds each process with common_utils.SEED before the test.
        seed = harness.common.common_utils.SEED
        self.assertEqual(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(seed)))

    def test_changes_its_environment(self) -> None:
        os.environ["SIMDIST_CASE_ADDED"] = str(self.rank)
        os.environ["SIMDIST_CASE_CHANGED"] = f"rank {self.rank}"
        os.environ.pop("SIMDIST_CASE_REMOVED", None)
        self.assertEqual(os.environ["SIMDIST_CASE_ADDED"], str(self.rank))

    def test_destroys_and_reinitialises(self) -> None:
        self._init()
        dist.destroy_process_group()
        self._init()
        t = torch.tensor([float(self.rank)])
        dist.broadcast(t, src=2)
        self.assertEqual(t.item(), 2.0)


class ThreadCases(MultiThreadedTestCase):
    """torch's threaded test process group, as test_multi_threaded_pg.py writes it."""

    @property
    def world_size(self) -> int:
        return 4

    def setUp(self) -> None:
        super().setUp()
        self._spawn_threads()

    def test_all_gather(self) -> None:
        out = [torch.empty(2) for _ in range(4)]
        dist.all_gather(out, torch.full((2,), float(self.rank)))
        self.assertEqual(torch.stack(out), torch.arange(4.0).repeat_interleave(2).view(4, 2))

    def test_rank_three_fails(self) -> None:
        dist.barrier()
        if self.rank == 3:
            raise ValueError("rank three's own mistake")

    def test_skips(self) -> None:
        raise unittest.SkipTest("not here")

    def test_rank_one_fails_while_the_others_wait_for_it(self) -> None:
        out = [torch.empty(2) for _ in range(4)]
        dist.all_gather(out, torch.full((2,), float(self.rank)))
        if self.rank == 1:
            raise AssertionError("rank one fails between two all_gathers")
        dist.all_gather(out, torch.full((2,), float(self.rank)))


def decorated_cases() -> type[unittest.TestCase]:
    """Built on call: ``spawn_threads_and_init_comms`` decorates when the class
    is defined, so the adapter must be installed first (as it is before a
    test module is imported under ``pytest -p simdist.torch_compat``)."""

    class DecoratedCases(unittest.TestCase):
        @harness.spawn_threads_and_init_comms(world_size=2)
        def test_broadcast(self) -> None:
            t = torch.tensor([float(dist.get_rank() + 5)])
            dist.broadcast(t, src=1)
            self.assertEqual(t.item(), 6.0)

        @harness.spawn_threads_and_init_comms(world_size=2)
        def test_rank_zero_fails(self) -> None:
            if dist.get_rank() == 0:
                raise ValueError("rank zero's own mistake")

        @harness.spawn_threads_and_init_comms(world_size=4)
        def test_every_rank_but_zero_fails_while_zero_waits(self) -> None:
            t = torch.full((3,), float(dist.get_rank()))
            out = [torch.empty(3) for _ in range(4)]
            dist.all_gather(out, t)
            if dist.get_rank() > 0:
                raise AssertionError("Mimic real test failure.")
            dist.all_gather(out, t)

    return DecoratedCases


class DTensorCases(dtensor.DTensorTestBase):
    """DTensorTestBase with @with_comms, as test/distributed/tensor writes it."""

    @property
    def world_size(self) -> int:
        return 4

    @dtensor.with_comms
    def test_redistribute_shard_to_replicate(self) -> None:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = self.build_device_mesh()
        torch.manual_seed(0)
        full = torch.randn(8, 3)
        d = distribute_tensor(full, mesh, [Shard(0)])
        self.assertEqual(d.to_local(), full.chunk(4)[self.rank])
        self.assertEqual(d.redistribute(mesh, [Replicate()]).to_local(), full)
