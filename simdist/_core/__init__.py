"""Threads and waits of one simulated world, with no torch.distributed.

``scheduler.Scheduler`` is the facade the backend and the run layer use over
the other modules (docs/internals.md, "the rooms"). Methods named
``*_locked`` are called with the world's lock held; the others take it.
"""
