"""A target that cannot be imported: a target error (exit 2), not a simdist crash."""

import a_module_that_does_not_exist  # noqa: F401


def test_never_collected() -> None:
    pass
