"""Running an op's completion on the last member to arrive."""

from __future__ import annotations

import torch

from ..rendezvous import Call
from . import overlap
from .ops import OpArgs, OpSpec


class Completion:
    """The completion the scheduler runs once every member has joined: the op's
    function from the ops table, with the arguments every member agreed on.

    Buffers shared between members complete as on a cluster when that cannot
    change the outcome, else fail (``overlap``). Inference tensors may only be
    written in inference mode, and the completing thread may belong to another
    rank than the tensor's owner.
    """

    __slots__ = ("args", "spec")

    def __init__(self, spec: OpSpec, args: OpArgs) -> None:
        self.spec = spec
        self.args = args

    def __call__(self, calls: list[Call]) -> None:
        for c in calls:
            if c.inference:
                with torch.inference_mode():
                    self._complete(calls)
                return
        self._complete(calls)

    def _complete(self, calls: list[Call]) -> None:
        clash = overlap.find_clash(calls)
        if clash is None:
            self.spec.complete(calls, self.args)
            return
        a = self.args
        error = overlap.clash_error(self.spec.name, a.group, a.seq, calls, clash)
        overlap.complete_privately(calls, lambda: self.spec.complete(calls, a), error)
