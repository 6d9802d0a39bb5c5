"""The keys of a call's payload, shared by the ops table, overlap checks and faults.

A payload maps these keys to the tensors one rank passed to one collective
(detached aliases of them). Each op's ``OpSpec`` says which keys it writes,
which it only reads and which carry the rank's contribution, so no other
module repeats the strings or guesses an op's buffer roles.
"""

from __future__ import annotations

from typing import Final

T: Final = "t"  # the one tensor of all_reduce, broadcast, reduce (read and written), gathers (read)
TS: Final = "ts"  # the tensors of all_reduce_coalesced
IN: Final = "in"  # one input tensor (flattened where the op works on flat memory)
INS: Final = "ins"  # a list of inputs (reduce_scatter, scatter's root, all_to_all)
OUT: Final = "out"  # one output tensor
OUT_FLAT: Final = "out_flat"  # all_gather_into_tensor's output, flattened
OUTS: Final = "outs"  # a list of outputs (all_gather, gather's root, all_to_all)
OUT_SPLITS: Final = "out_splits"  # all_to_all_single's row counts (not tensors)
IN_SPLITS: Final = "in_splits"

TENSOR_KEYS: Final = (T, TS, IN, INS, OUT, OUT_FLAT, OUTS)
