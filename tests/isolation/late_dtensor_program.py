"""Run by tests/isolation/test_isolation_round3.py in a fresh interpreter: DTensor is first
imported inside the ranks (as a test module that imports lazily), and TP +
loss_parallel() must still give every rank the float64 answer."""

import sys

import torch
import torch.nn.functional as F

import simdist

assert "torch.distributed.tensor" not in sys.modules


def body(ctx):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    logits = distribute_tensor(torch.arange(16.0).view(2, 8), mesh, [Shard(1)]).requires_grad_()
    with loss_parallel():
        loss = F.cross_entropy(logits, torch.tensor([1, 6]))
        loss.backward()
        dist.barrier()
    return loss.full_tensor().item(), logits.grad.full_tensor().tolist()


want_logits = torch.arange(16.0, dtype=torch.float64).view(2, 8).requires_grad_()
want = F.cross_entropy(want_logits, torch.tensor([1, 6]))
want.backward()
results = simdist.run(body, world_size=4, timeout=60)
for loss, grad in results:
    assert abs(loss - want.item()) < 1e-5, (loss, want.item())
    assert torch.allclose(torch.tensor(grad, dtype=torch.float64), want_logits.grad, atol=1e-5)
DTensor = sys.modules["torch.distributed.tensor._api"].DTensor
assert DTensor._op_dispatcher._custom_op_handlers.keys().isdisjoint({torch.ops.aten._log_softmax.default})
print("OK")
