"""How the ranks of a step agree: on its arguments before any other collective, and on committing it.

Every decision that one rank could make differently from another (a bad
batch, a failure while preparing the update) goes through one collective that
every rank joins, so ranks raise together instead of leaving a peer waiting.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import groups as _groups  # world_group looked up at call time: benchmarks replace it
from .batch import MASK_DTYPES, CotrainBatch, check_step_arguments
from .config import CotrainConfig
from .groups import ParallelGroups

_CP_FIELDS = ("batch rows", "local sequence length", "mode", "num_microbatches", "mask dtype")


def all_ranks_ok(ok: bool) -> bool:
    """True on every rank iff ``ok`` on every rank: one MIN all-reduce over the world.

    One collective, not a MIN per axis: with hops over TP, then PP, then
    DP, a rank failing in the last hop leaves the other stages' DP groups
    complete, and they would commit a step that the retry applies again.
    """
    world = _groups.world_group()
    if world is None:
        return ok
    flag = torch.tensor([1.0 if ok else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=world)
    return bool(flag.item() > 0)


def fail_together(failure: BaseException | None, if_another_failed: Exception) -> None:
    """Raises on every rank if any rank failed: this rank's own ``failure``, else ``if_another_failed``.

    Every rank joins the one agreement collective, whether it failed or not.
    """
    everyone_ok = all_ranks_ok(failure is None)
    if failure is not None:
        raise failure
    if not everyone_ok:
        raise if_another_failed


def agree_on_arguments(
    batch: object, mode: object, num_microbatches: object, config: CotrainConfig, groups: ParallelGroups
) -> None:
    """Checks this rank's ``train_step`` arguments; raises on every rank if any rank's are bad."""
    problem: Exception | None = None
    try:
        check_step_arguments(batch, mode, num_microbatches, config, groups.size("cp"))
    except (TypeError, ValueError) as error:
        problem = error
    if groups.cp is not None:
        # The boundary exchange's messages are sized by the batch and run
        # once per microbatch: CP ranks must agree on both, or a peer would
        # wait for a message of another size (a hang on NCCL).
        checked = batch if problem is None and isinstance(batch, CotrainBatch) else None
        mismatch = cp_disagreement(checked, str(mode), num_microbatches, groups.cp)
        if problem is None and mismatch is not None:
            problem = ValueError(mismatch)
    # Ranks agree before any other collective, so a bad batch on one rank
    # fails every rank instead of leaving peers waiting.
    another = ValueError(
        "CotrainWorker.train_step: another rank's arguments were invalid (that rank raised the "
        "details); this rank stops too"
    )
    fail_together(problem, another)


def cp_disagreement(
    batch: CotrainBatch | None, mode: str, num_microbatches: object, cp_group: dist.ProcessGroup
) -> str | None:
    """A message if the CP ranks' batch shapes, modes or microbatch counts differ (same on each CP rank).

    One MIN all-reduce of each value and its negation gives every CP rank
    the group's minimum and maximum; a rank whose arguments already failed
    (``batch`` None) contributes values that change neither.
    """
    if batch is None or not isinstance(num_microbatches, int):
        values = [math.inf] * (2 * len(_CP_FIELDS))
    else:
        mine = [
            *batch.tokens.shape,
            float(mode == "split"),
            float(num_microbatches),
            float(MASK_DTYPES.index(batch.mask.dtype)),
        ]
        values = mine + [-x for x in mine]
    table = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MIN, group=cp_group)
    count = len(_CP_FIELDS)
    low, high = table[:count].tolist(), [-x for x in table[count:].tolist()]
    differing = [
        f"{name} from {_shown(name, lo)} to {_shown(name, hi)}"
        for name, lo, hi in zip(_CP_FIELDS, low, high)
        if lo != hi and math.isfinite(lo)  # inf: every rank failed
    ]
    if not differing:
        return None
    # The boundary rows travel as raw bytes: a peer's mask of another dtype
    # would be read back as garbage, not refused.
    return (
        f"CotrainWorker.train_step: the CP ranks of one sequence shard disagree on {', '.join(differing)}; "
        "every CP rank must pass its shard of the same batch "
        "(shard_batch_for_cp) with the same mode and num_microbatches"
    )


def _shown(name: str, value: float) -> str:
    if name == "mode":
        return ("monolithic", "split")[int(value)]
    return str(MASK_DTYPES[int(value)]) if name == "mask dtype" else f"{value:g}"
