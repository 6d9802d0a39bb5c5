"""Running an op's completion on the last member to arrive."""

from __future__ import annotations

from typing import Any

import torch

from .._core.records import Call, GroupInfo
from . import overlap
from .ops import OpArgs, OpSpec


class Completion(OpArgs):
    """The completion the scheduler runs once every member has joined: the op's
    function from the ops table, with the arguments every member agreed on
    (it is its own ``OpArgs``: one object per call on the hot path).

    Buffers shared between members complete as on a cluster when that cannot
    change the outcome, else fail (``overlap``). Inference tensors may only be
    written in inference mode, and the completing thread may belong to another
    rank than the tensor's owner.
    """

    __slots__ = ("spec",)

    def __init__(self, spec: OpSpec, group: GroupInfo, seq: int, model: Any, red: str, root: int) -> None:
        self.spec = spec
        self.group = group
        self.seq = seq
        self.model = model
        self.red = red
        self.root = root

    def __call__(self, calls: list[Call]) -> None:
        for c in calls:
            if c.inference:
                with torch.inference_mode():
                    self._complete(calls)
                    self._land(calls)
                return
        clash = overlap.find_clash(calls)
        if clash is None:
            self.spec.complete(calls, self)
        else:
            self._shared(calls, clash)
        self._land(calls)

    @staticmethod
    def _land(calls: list[Call]) -> None:
        # What a fault does to a member's result, once the result is there.
        for c in calls:
            if c.landing is not None:
                c.landing()

    def _complete(self, calls: list[Call]) -> None:
        clash = overlap.find_clash(calls)
        if clash is None:
            self.spec.complete(calls, self)
        else:
            self._shared(calls, clash)

    def _shared(self, calls: list[Call], clash: Any) -> None:
        error = overlap.clash_error(self.spec.name, self.group, self.seq, calls, clash)
        overlap.complete_privately(calls, lambda: self.spec.complete(calls, self), error)
