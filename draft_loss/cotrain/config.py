"""The reference model's hyper-parameters, checked when the config is built."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CotrainConfig:
    vocab_size: int = 24
    hidden_size: int = 8
    ffn_size: int = 12
    num_layers: int = 2
    bin_weights: tuple[float, ...] = (1.0, 0.5, 2.0, 0.0)
    draft_loss_weight: float = 0.7
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.01
    policy_max_grad_norm: float | None = None
    draft_max_grad_norm: float | None = None
    token_chunk_size: int = 5
    init_std: float = 0.6
    seed: int = 0
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "ffn_size", "num_layers", "token_chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CotrainConfig.{name} must be a positive int, got {value!r}")
        if not self.bin_weights or any(not (w >= 0 and math.isfinite(w)) for w in self.bin_weights):
            raise ValueError(
                f"CotrainConfig.bin_weights must be non-empty, finite, >= 0, got {self.bin_weights}"
            )
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float64):
            raise ValueError(f"CotrainConfig.dtype must be float32, bfloat16 or float64, got {self.dtype}")

    @property
    def num_bins(self) -> int:
        return len(self.bin_weights)

    def max_grad_norms(self) -> dict[str, float]:
        """Clipping thresholds of the groups that are clipped (group name -> max norm)."""
        pairs = (("policy", self.policy_max_grad_norm), ("draft", self.draft_max_grad_norm))
        return {name: value for name, value in pairs if value is not None}
