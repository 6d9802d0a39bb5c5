"""simdist.strategies draw within Hypothesis' size budget by construction: a
default draw of each, composed as a campaign's properties compose them (a
layout's degrees sizing the masks), is never rejected, for size or by a
filter. (Their masks were one choice per token and row, their lists and
conditional draws varied a case's choices: about 5% of a campaign's cases gave
up, "exceeded maximum test case size".)"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from strategy_budget import gave_up

from simdist import strategies as S


@st.composite
def _masks(draw: st.DrawFn) -> object:
    layout = draw(S.layouts())
    return draw(S.token_distributions(layout.dp, draw(st.integers(1, 4)), draw(S.sequence_lengths())))


@st.composite
def _rows(draw: st.DrawFn) -> object:
    return draw(S.mask_rows(draw(S.sequence_lengths())))


@st.composite
def _token_masks(draw: st.DrawFn) -> object:
    return draw(S.token_masks(draw(st.integers(1, 4)), draw(S.sequence_lengths())))


@st.composite
def _plans(draw: st.DrawFn) -> object:
    return draw(S.fault_plans(draw(S.layouts()).world_size))


@st.composite
def _everything(draw: st.DrawFn) -> object:
    """One of each in one case, as a property draws them."""
    layout = draw(S.layouts(axes=("tp", "cp", "dp", "pp")))
    seq_len = draw(S.sequence_lengths())
    return (
        draw(S.token_distributions(layout.dp, draw(st.integers(1, 4)), seq_len)),
        draw(S.mask_rows(seq_len)),
        draw(S.bin_weights()),
        draw(S.dtype_names()),
        draw(S.reductions()),
        draw(S.faults(layout.world_size)),
        draw(S.fault_plans(layout.world_size)),
        draw(S.probe_faults(["a", "b"], layout.world_size)),
    )


STRATEGIES = {
    "layouts": S.layouts(),
    "sequence_lengths": S.sequence_lengths(),
    "mask_rows": _rows(),
    "token_distributions": _masks(),
    "token_masks": _token_masks(),
    "bin_weights": S.bin_weights(),
    "reductions": S.reductions(),
    "faults": S.faults(8),
    "fault_plans": _plans(),
    "all of them in one case": _everything(),
}


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_no_default_draw_is_rejected(name: str) -> None:
    assert gave_up(STRATEGIES[name]) == {}


def test_a_mask_too_large_for_one_case_is_refused_up_front() -> None:
    with pytest.raises(
        ValueError, match=r"ranks \* microbatches \* rows_per_microbatch\[1\] = 800 rows, more than the 400"
    ):
        S.token_distributions(100, 4, 5, rows_per_microbatch=(1, 2))
