"""One rank's stage of the reference model: its layers, its losses, and its shard of the parameters.

The policy is a token embedding (first stage), residual tanh-MLP layers
(column- then row-parallel over TP) and a vocab-sharded output layer (last
stage). The draft head (last stage) reads the detached final hidden state at
t and its own embedding of token t+1, and learns the detached, aligned policy
logits with ``soft_cross_entropy``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..align import align_for_draft
from ..context_parallel import shift_left
from ..soft_ce import soft_cross_entropy
from ..stats import DraftLossStats
from .batch import CotrainBatch
from .config import CotrainConfig
from .groups import ParallelGroups
from .parameters import layers_of_stage, rank_parameters, tp_shard_range
from .tp_layers import copy_to_tp, reduce_from_tp, vocab_parallel_cross_entropy


def embedding_lookup(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``weight[ids]``, whose backward sums each row's gradient in float32.

    The backward of a gather adds one row's gradient over every token that
    looked it up. In bfloat16 that running sum of hundreds of terms stagnates
    (a 768-token step over a vocabulary of 2 lost 13% of the embedding
    gradient against float64), and how much is lost depends on how many tokens
    one backward sees, so a split step and the monolithic one disagree.
    Gathering from a float32 copy gives the same forward values bitwise and a
    backward that accumulates in float32 and rounds once."""
    if weight.dtype in (torch.bfloat16, torch.float16):
        return weight.float()[ids].to(weight.dtype)
    return weight[ids]


class StageModel:
    """The layers of this rank's PP stage, with this rank's TP shard of their parameters."""

    def __init__(self, config: CotrainConfig, groups: ParallelGroups) -> None:
        tp_size, tp_rank = groups.size("tp"), groups.rank("tp")
        for name, size in (("vocab_size", config.vocab_size), ("ffn_size", config.ffn_size)):
            # Shards may differ in size (tp_shard_range), but none may be empty:
            # a rank without a vocabulary row has no logits to normalise.
            if size < tp_size:
                raise ValueError(
                    f"CotrainWorker: {name} ({size}) must be at least the TP size ({tp_size}), "
                    "so that every TP rank holds a shard"
                )
        self.config = config
        self.vocab_start, _ = tp_shard_range(config.vocab_size, tp_rank, tp_size)
        self.stage, self.num_stages = groups.rank("pp"), groups.size("pp")
        self.is_first, self.is_last = self.stage == 0, self.stage == self.num_stages - 1
        self.layers = layers_of_stage(config.num_layers, self.stage, self.num_stages)
        stages = {f"layer:{i}" for i in self.layers}
        stages |= {"first"} if self.is_first else set()
        stages |= {"last"} if self.is_last else set()
        self.params = rank_parameters(config, stages, tp_rank, tp_size)
        self.bin_weights = torch.tensor(config.bin_weights, dtype=torch.float32)

    def hidden_shape(self, tokens: torch.Tensor) -> tuple[int, ...]:
        return (*tokens.shape, self.config.hidden_size)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return embedding_lookup(self.params["embedding.weight"], tokens)

    def layer(self, i: int, hidden: torch.Tensor, tp: dist.ProcessGroup | None) -> torch.Tensor:
        p = self.params
        inner = torch.tanh(copy_to_tp(hidden, tp) @ p[f"layers.{i}.fc1.weight"].T + p[f"layers.{i}.fc1.bias"])
        out = reduce_from_tp(inner @ p[f"layers.{i}.fc2.weight"].T, tp)
        return hidden + out + p[f"layers.{i}.fc2.bias"]

    def losses(
        self, batch: CotrainBatch, hidden: torch.Tensor, groups: ParallelGroups
    ) -> tuple[torch.Tensor, DraftLossStats]:
        """The policy's raw loss sum and the draft's statistics (last stage)."""
        p, tp, cp = self.params, groups.tp, groups.cp
        logits = copy_to_tp(hidden, tp) @ p["output.weight"].T  # [B, S, V_local]
        # The token at t+1 (policy label, draft input), its mask and bin, with
        # their boundary rows from the CP neighbours.
        labels, next_mask, next_bins = shift_left(batch.tokens, batch.mask, batch.bin_ids, cp_group=cp)
        shifted_mask = next_mask.to(torch.float32)
        ce = vocab_parallel_cross_entropy(logits, labels, vocab_start=self.vocab_start, group=tp)
        policy_sum = (ce * shifted_mask).sum()
        # Draft position t: hidden state at t (detached: the draft does not
        # train the policy) and the draft's embedding of token t+1, looked up
        # here from the token id, so its gradient lands in this rank's replica.
        # (Without CP the call keeps its two-argument form, which the fuzz
        # catalogue's alignment mutants replace.)
        if cp is None:
            teacher, draft_mask = align_for_draft(logits.detach(), batch.mask)
        else:
            teacher, draft_mask = align_for_draft(logits.detach(), batch.mask, cp_group=cp)
        draft_input = torch.cat(
            [hidden.detach(), embedding_lookup(p["draft.embedding.weight"], labels)], dim=-1
        )
        draft_hidden = torch.tanh(draft_input @ p["draft.fc.weight"].T + p["draft.fc.bias"])
        draft_logits = copy_to_tp(draft_hidden, tp) @ p["draft.head.weight"].T
        stats = soft_cross_entropy(
            draft_logits,
            teacher,
            draft_mask.to(torch.float32),
            tp_group=tp,
            token_chunk_size=self.config.token_chunk_size,
            bin_ids=next_bins,
            weights=self.bin_weights,
        )
        return policy_sum, stats
