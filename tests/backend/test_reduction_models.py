"""Reduction-order models: each model's all_reduce equals a re-implementation of
its documented order written here with plain torch ops; integer-valued float
sums agree under every model; BF16 sums of adversarial data do not; and no
model's result depends on which rank arrives first.

Documented orders (simdist/reduction.py):
- rank: ((x0 + x1) + x2) + ... in group-rank order;
- ring: the flattened tensor is cut into one chunk per rank (the first
  ``numel % n`` chunks one element longer); chunk c starts at rank (c + 1) % n
  and adds the next ranks around the ring, rounding at every hop;
- tree: adjacent pairs, then pairs of pairs; an odd last item is carried up;
- shuffled: some permutation of the ranks per call, fixed by the seed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import simdist
from simdist import FaultPlan, Layout

TIMEOUT = 60.0
MODELS = ("rank", "ring", "tree", "shuffled")
Tensors = Sequence[torch.Tensor]


# --- references: the documented orders, element dtype kept at every step --------------


def ref_rank(xs: Tensors) -> torch.Tensor:
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = acc + x
    return acc


def ref_tree(xs: Tensors) -> torch.Tensor:
    level = list(xs)
    while len(level) > 1:
        paired = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0].clone()


def ref_ring(xs: Tensors) -> torch.Tensor:
    n = len(xs)
    flat = [x.reshape(-1) for x in xs]
    numel = flat[0].numel()
    base, extra = divmod(numel, n)
    out = torch.empty_like(flat[0])
    lo = 0
    for c in range(n):
        hi = lo + base + (1 if c < extra else 0)
        start = (c + 1) % n
        acc = flat[start][lo:hi].clone()
        for hop in range(1, n):
            acc = acc + flat[(start + hop) % n][lo:hi]
        out[lo:hi] = acc
        lo = hi
    return out.view(xs[0].shape)


def ref_in_order(xs: Tensors, order: Sequence[int]) -> torch.Tensor:
    return ref_rank([xs[i] for i in order])


REFERENCES: dict[str, Callable[[Tensors], torch.Tensor]] = {
    "rank": ref_rank,
    "ring": ref_ring,
    "tree": ref_tree,
}


def bits(t: torch.Tensor) -> torch.Tensor:
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(ints)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


# --- the SPMD body ------------------------------------------------------------------


def all_reduce_body(ctx: simdist.RankContext, data: torch.Tensor, axis: str) -> torch.Tensor:
    group = ctx.groups[axis] if axis != "world" else ctx.groups.world
    t = data[ctx.rank].clone()
    dist.all_reduce(t, group=group)
    return t


def reduce_all(
    data: torch.Tensor, model: str, seed: int = 0, faults: FaultPlan | None = None
) -> torch.Tensor:
    """all_reduce of ``data[r]`` over a flat world; every rank must agree bitwise."""
    results = simdist.run(
        all_reduce_body,
        world_size=data.shape[0],
        reduction=model,
        seed=seed,
        faults=faults,
        timeout=TIMEOUT,
        args=(data, "world"),
    )
    for other in results[1:]:
        assert same_bits(other, results[0])
    return results[0]


def adversarial_bf16(n: int, numel: int) -> torch.Tensor:
    """One large value per element (on a rotating rank) and small ones elsewhere:
    in bf16 (8 significant bits) 256 + 1 rounds back to 256, so the result
    depends on when the small values meet each other and when they meet the big one."""
    gen = torch.Generator().manual_seed(n * 1000 + numel)
    data = torch.randint(1, 4, (n, numel), generator=gen).to(torch.float32)
    for j in range(numel):
        data[(j * 3) % n, j] = 256.0 * (1 + j % 2)
    return data.to(torch.bfloat16)


# --- exact data: every model agrees -------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(2, 6),
    numel=st.integers(1, 9),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_integer_valued_float_sums_agree_under_every_model(
    n: int, numel: int, dtype: torch.dtype, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    ints = torch.randint(-1000, 1001, (n, numel), generator=gen)
    exact = [sum(int(v) for v in ints[:, j]) for j in range(numel)]
    for model in MODELS:
        got = reduce_all(ints.to(dtype), model, seed=seed)
        assert got.dtype == dtype
        assert got.tolist() == exact, model


# --- bf16: each model is its documented order, and the orders differ ------------------


@pytest.mark.parametrize("n, numel", [(4, 8), (4, 3), (5, 11), (8, 16)])
def test_each_model_follows_its_documented_order_in_bf16(n: int, numel: int) -> None:
    data = adversarial_bf16(n, numel)
    rows = list(data)
    for model, reference in REFERENCES.items():
        assert same_bits(reduce_all(data, model), reference(rows)), model


def test_bf16_results_differ_between_models_on_adversarial_data() -> None:
    data = adversarial_bf16(4, 8)
    got = {model: reduce_all(data, model) for model in ("rank", "ring", "tree")}
    exact = data.to(torch.float64).sum(0)
    for a, b in itertools.combinations(got, 2):
        assert not same_bits(got[a], got[b]), (a, b)
    # None is exact: this is the spread a parity tolerance must cover.
    for model, value in got.items():
        assert not torch.equal(value.to(torch.float64), exact), model


def test_shuffled_is_some_rank_permutation_fixed_by_the_seed() -> None:
    data = adversarial_bf16(4, 8)
    rows = list(data)
    candidates = {perm: ref_in_order(rows, perm) for perm in itertools.permutations(range(4))}
    by_seed = {}
    for seed in range(8):
        got = reduce_all(data, "shuffled", seed=seed)
        assert same_bits(reduce_all(data, "shuffled", seed=seed), got), "same seed, same bits"
        assert any(same_bits(got, c) for c in candidates.values()), seed
        by_seed[seed] = got
    assert len({tuple(bits(t).tolist()) for t in by_seed.values()}) > 1, "the seed must change the order"


def test_models_run_in_group_rank_order_on_a_sub_group() -> None:
    layout = Layout(tp=2, dp=4)
    data = adversarial_bf16(layout.world_size, 6)
    for model, reference in REFERENCES.items():
        results = simdist.run(
            all_reduce_body, layout=layout, reduction=model, timeout=TIMEOUT, args=(data, "dp")
        )
        for rank, got in enumerate(results):
            members = layout.group_of("dp", rank)
            assert same_bits(got, reference([data[m] for m in members])), (model, rank)


def test_a_model_instance_is_accepted_and_unknown_names_refused() -> None:
    data = adversarial_bf16(4, 8)
    assert same_bits(reduce_all(data, simdist.Ring()), ref_ring(list(data)))  # type: ignore[arg-type]
    assert same_bits(reduce_all(data, simdist.Shuffled(3)), reduce_all(data, "shuffled", seed=3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reduction must be one of"):
        simdist.run(all_reduce_body, world_size=2, reduction="butterfly", args=(data, "world"))


# --- arrival order never matters ---------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_results_do_not_depend_on_arrival_order(model: str) -> None:
    n = 4
    data = adversarial_bf16(n, 8)
    baseline = reduce_all(data, model, seed=5)
    for late in (0, n - 1):
        delayed = reduce_all(
            data, model, seed=5, faults=FaultPlan.delay(rank=late, seconds=0.05, op="all_reduce")
        )
        assert same_bits(delayed, baseline), (model, late)
