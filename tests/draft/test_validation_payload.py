"""The TP-wide argument check's payload: an error message travels to every rank
in a fixed number of int64 slots, cut to fit with a visible "..."."""

from __future__ import annotations

from draft_loss import _validation as v


def _round_trip(text: str) -> str:
    return v._decode_message(v._encode(ValueError(text), ()))


def test_a_message_that_fits_arrives_whole() -> None:
    exact = "m" * v._MESSAGE_BYTES
    assert _round_trip(exact) == exact
    assert _round_trip("batch.tokens must be int64") == "batch.tokens must be int64"


def test_a_longer_message_is_cut_to_the_payload_with_an_ellipsis() -> None:
    text = "".join(f"{i:04d} " for i in range(400))  # 2,000 bytes, each position distinct
    got = _round_trip(text)
    assert len(got.encode("utf-8")) == v._MESSAGE_BYTES
    assert got == text[: v._MESSAGE_BYTES - 3] + "..."


def test_a_cut_never_splits_a_character() -> None:
    # Each "é" is two bytes and the cut keeps 445: after "xy" it lands inside one,
    # which is dropped whole rather than decoded as a replacement character.
    got = _round_trip("xy" + "é" * v._MESSAGE_BYTES)
    assert got == "xy" + "é" * ((v._MESSAGE_BYTES - 3 - 2) // 2) + "..."
