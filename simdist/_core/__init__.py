"""Threads and waits, no torch.distributed."""
