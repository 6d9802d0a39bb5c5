"""The adapter installed for one test, and put back as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from simdist import torch_compat


@pytest.fixture
def compat() -> Iterator[None]:
    was = torch_compat.installed()
    torch_compat.install()
    yield
    if not was:
        torch_compat.uninstall()
