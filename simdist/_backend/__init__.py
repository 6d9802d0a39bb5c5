"""The torch.distributed face of simdist.

- ``process_group``: ``SimProcessGroup`` (validation, fingerprint, dispatch
  only), with its mixins ``p2p`` (send/recv and their delivery), ``coalesced``
  (the coalesced forms as single calls) and ``refused`` (calls simdist
  refuses); ``validation``: the argument checks they share; ``buffers``: how a
  call holds the rank's tensors
- ``ops``: the ops table, one completion function per op and its ``OpSpec``
  (buffer roles, contribution, gloo's version-counter effects); ``payload``:
  the payload keys; ``kernels``: the tensor arithmetic the completions share
- ``dispatch``: running a completion on the last member; ``overlap``: members
  that share memory; ``work``: Work handles
- ``hooks``: the world's per-call hooks (flight record, faults, fingerprint
  and call-site comparison); ``faulting``: what a corrupt fault damages
- ``shadow``: the c10d dispatcher ops active TorchDispatchModes (CommDebugMode) see
- ``group``: a communicator's structured identity (axes, ranks, run)
- ``world_hooks``: what a group needs from its world; ``registration``: the
  c10d backend plugin; ``current``: which rank a thread is

Nothing is imported here, so ``simdist.faults`` can read the ops table without
a cycle.
"""
