"""Complex tensors in reductions and gather: simdist does what gloo does.

gloo and NCCL reduce complex tensors as their real views, so SUM and AVG work
for reduce, reduce_scatter and reduce_scatter_tensor and every other reduce op
is refused; gloo's gather refuses complex tensors outright (torch 2.13). The
reference is a real gloo world; only the results torch specifies are compared
(a reduce's root, every member of the scatters).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

import simdist

pytestmark = [pytest.mark.gloo, pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")]

TIMEOUT = 60.0
OPS = ("SUM", "AVG", "PRODUCT", "MAX")


def _data(rank: int, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + k)
    return torch.complex(torch.randn(3, generator=g), torch.randn(3, generator=g))


def reductions(ctx: simdist.RankContext, ops: tuple[str, ...]) -> dict[str, Any]:
    r, n = ctx.rank, ctx.world_size
    out: dict[str, Any] = {}
    for name in ops:
        op = getattr(dist.ReduceOp, name)

        def attempt(key: str, call: Any, read: Any) -> None:
            try:
                call()
                out[f"{key} {name}"] = read()
            except (RuntimeError, ValueError, simdist.UnsupportedOperationError):
                out[f"{key} {name}"] = "refused"

        t = _data(r, 0)
        attempt("reduce", lambda: dist.reduce(t, dst=0, op=op), lambda: t if r == 0 else "non-root")
        o = torch.zeros(3, dtype=torch.complex64)
        ins = [_data(r, 1 + j) for j in range(n)]
        attempt("reduce_scatter", lambda: dist.reduce_scatter(o, ins, op=op), lambda: o)
        o2 = torch.zeros(3, dtype=torch.complex64)
        big = torch.cat([_data(r, 10 + j) for j in range(n)])
        attempt("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(o2, big, op=op), lambda: o2)
    return out


def gather_complex(ctx: simdist.RankContext) -> str:
    outs = [torch.zeros(3, dtype=torch.complex64) for _ in range(ctx.world_size)] if ctx.rank == 0 else None
    try:
        dist.gather(_data(ctx.rank, 0), outs, dst=0)
    except (RuntimeError, simdist.UnsupportedOperationError) as exc:
        return "refused: " + str(exc)
    return "gathered"


def test_complex_reductions_match_a_gloo_world() -> None:
    gloo = simdist.run_processes(reductions, world_size=3, backend="gloo", timeout=120, args=(OPS,))
    # A refused reduce op fails a simdist run even when caught (as every
    # unsupported op does), so simdist runs the accepted ones here and the
    # refusals in the test below.
    sim = simdist.run(reductions, world_size=3, timeout=TIMEOUT, args=(("SUM", "AVG"),))
    for rank in range(3):
        assert set(sim[rank]) == {k for k in gloo[rank] if k.endswith(("SUM", "AVG"))}
        for key, got in sim[rank].items():
            want = gloo[rank][key]
            if isinstance(want, torch.Tensor):
                assert isinstance(got, torch.Tensor), (rank, key, got)
                torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            else:
                assert got == want, (rank, key)
    # What gloo does, stated, so a change on either side shows here.
    assert isinstance(gloo[0]["reduce SUM"], torch.Tensor) and isinstance(
        gloo[1]["reduce_scatter AVG"], torch.Tensor
    )
    assert gloo[0]["reduce PRODUCT"] == gloo[2]["reduce_scatter_tensor MAX"] == "refused"


def test_a_refused_complex_reduce_op_says_which_ops_work() -> None:
    def body(ctx: simdist.RankContext) -> None:
        dist.reduce(_data(ctx.rank, 0), dst=0, op=dist.ReduceOp.MAX)

    with pytest.raises(simdist.RankError) as info:
        simdist.run(body, world_size=2, timeout=TIMEOUT)
    assert sorted(info.value.failures) == [0, 1]
    assert "reduce: reduce op MAX is not supported on complex tensors" in str(info.value)
    assert "SUM and AVG only" in str(info.value)


def test_complex_gather_is_refused_as_on_gloo() -> None:
    gloo = simdist.run_processes(gather_complex, world_size=2, backend="gloo", timeout=120)
    assert all(g.startswith("refused") for g in gloo), gloo
    with pytest.raises(simdist.RankError) as info:
        simdist.run(gather_complex, world_size=2, timeout=TIMEOUT)
    # Caught or not, an unsupported op fails the run on every member.
    assert sorted(info.value.failures) == [0, 1]
    assert "gather: complex dtype torch.complex64 is not supported" in str(info.value)
