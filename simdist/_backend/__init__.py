"""The torch.distributed face of simdist (the module map: docs/internals.md).

Nothing is imported here, so ``simdist.faults`` can read the ops table without
a cycle.
"""
