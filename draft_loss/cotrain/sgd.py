"""A deterministic, two-phase SGD with momentum and weight decay.

``prepare`` computes every new value without storing any; ``commit`` stores
them. Between the two, ranks agree that every rank prepared successfully, so a
failure anywhere leaves every rank's parameters and momentum buffers as they
were, and a retry of the step equals a clean one bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Probe = Callable[[str], None]


@dataclass
class PreparedStep:
    values: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


class MomentumSGD:
    def __init__(self, lr: float, momentum: float, weight_decay: float) -> None:
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.buffers: dict[str, torch.Tensor] = {}

    def prepare(
        self,
        params: dict[str, torch.Tensor],
        grads: dict[str, torch.Tensor],
        probe: Probe | None = None,
    ) -> PreparedStep:
        """New fp32 parameter values and momentum buffers; nothing is stored."""
        values: dict[str, torch.Tensor] = {}
        buffers: dict[str, torch.Tensor] = {}
        for index, (name, param) in enumerate(params.items()):
            if probe is not None:
                probe(f"optimizer:{index}")
            update = grads[name] + self.weight_decay * param
            previous = self.buffers.get(name)
            buffer = update if previous is None else self.momentum * previous + update
            buffers[name] = buffer
            values[name] = param - self.lr * buffer
        return PreparedStep(values, buffers)

    def commit(self, params: dict[str, torch.Tensor], prepared: PreparedStep) -> None:
        # Plain stores of already computed values: nothing here can fail half-way.
        for name, param in params.items():
            param.copy_(prepared.values[name])
        self.buffers.update(prepared.buffers)
