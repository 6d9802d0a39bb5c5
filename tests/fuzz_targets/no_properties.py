"""A target with tests but no Hypothesis property: the campaign must say so (exit 2)."""


def test_plain() -> None:
    assert 1 + 1 == 2
