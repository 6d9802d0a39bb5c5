"""Threads and waits of one simulated world, with no torch.distributed.

``scheduler.Scheduler`` is the facade the backend and the run layer use; the
rooms behind it: ``records`` (what a rank can wait on), ``slots`` (each
thread's state and the counters only its methods edit), ``turns`` (the run
token of scheduled mode and the baton of concurrent mode, one interface),
``matching`` (collectives and point-to-point), ``deadlock`` (which waits can
never complete, on ``waitfor``'s pure functions), ``report`` (the text),
``helper_book`` (helper threads and pool work items), ``identity`` (which rank
this thread is: the one thread-local), plus ``policy`` (who
runs next), ``spawn`` (starting rank threads) and ``stacks`` (call sites).
Methods named ``*_locked`` are called with the world's lock held; the others
take it.
"""
