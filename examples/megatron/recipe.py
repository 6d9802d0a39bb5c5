"""Megatron-core on simdist: parallel_state and a tensor-parallel layer,
unmodified, in every rank of a TP x DP x PP layout.

    python examples/megatron/recipe.py

Each rank initialises ``parallel_state`` inside its body, exactly as a
training script does after ``init_process_group`` (simdist has already
initialised the default group), and destroys it before returning. simdist
keeps Megatron's module globals per rank, so the ranks do not see each
other's groups, and each run starts from none. CPU caveats are in
docs/clients.md ("Megatron-core: a recipe").
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import simdist

LAYOUT = simdist.Layout(tp=2, dp=2, pp=2)  # Megatron's rank order: tp fastest, then cp, dp, pp
HIDDEN, FFN, TOKENS = 8, 16, 6


def body(ctx: simdist.RankContext) -> dict[str, object]:
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.model_parallel_config import ModelParallelConfig

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=ctx.layout.tp, pipeline_model_parallel_size=ctx.layout.pp
    )
    try:
        # Megatron's model-parallel RNG tracker (model_parallel_cuda_manual_seed,
        # get_cuda_rng_tracker().fork() around dropout) keeps CUDA generator
        # states and needs CUDA: on a CPU, leave it out and seed the CPU
        # generator per rank where the script would fork the tracker.
        torch.manual_seed(1234 + parallel_state.get_tensor_model_parallel_rank())

        config = ModelParallelConfig(
            tensor_model_parallel_size=ctx.layout.tp,
            use_cpu_initialization=True,  # no GPU: build the master weights on the CPU
            params_dtype=torch.float64,
        )
        layer = tensor_parallel.ColumnParallelLinear(
            HIDDEN, FFN, config=config, init_method=torch.nn.init.ones_, bias=False, gather_output=False
        )  # gather_output=True gathers into a buffer on torch.cuda.current_device(): needs CUDA
        x = torch.arange(TOKENS * HIDDEN, dtype=torch.float64).reshape(TOKENS, 1, HIDDEN) / 10
        y, _ = layer(x)
        return {
            "groups": {
                "tp": dist.get_process_group_ranks(parallel_state.get_tensor_model_parallel_group()),
                "dp": dist.get_process_group_ranks(parallel_state.get_data_parallel_group()),
                "pp": dist.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group()),
            },
            "output": y,
        }
    finally:
        parallel_state.destroy_model_parallel()


def main() -> list[dict[str, object]]:
    results = simdist.run(body, layout=LAYOUT)
    for rank, result in enumerate(results):
        assert result["groups"] == {a: LAYOUT.group_of(a, rank) for a in ("tp", "dp", "pp")}
        want = torch.arange(TOKENS * HIDDEN, dtype=torch.float64).reshape(TOKENS, 1, HIDDEN).sum(-1) / 10
        shard = FFN // LAYOUT.tp  # each TP rank's columns of the output
        assert torch.allclose(result["output"], want.unsqueeze(-1).expand(TOKENS, 1, shard))  # type: ignore[arg-type]
    print(f"Megatron-core on {LAYOUT}: groups and a ColumnParallelLinear as on a cluster")
    return results


if __name__ == "__main__":
    main()
