"""docs/differences.md's table and the registry of known differences say the same.

Every entry of ``tests/differential/diff_known.KNOWN`` (pinned by
``test_known_differences.py``) is a row of the table whose status is
"intended"; every "intended" row names an entry; a "fixed" row names none
(its difference is gone, its test is named in the row).
"""

from __future__ import annotations

import re
from pathlib import Path

import diff_known

PAGE = Path(__file__).resolve().parents[2] / "docs" / "differences.md"
_ROW = re.compile(r"^\| `([a-z0-9-]+)` \|.*\| ([^|]+) \|$", re.M)


def table() -> dict[str, str]:
    rows = {name: status.strip() for name, status in _ROW.findall(PAGE.read_text(encoding="utf-8"))}
    assert len(rows) >= 10, f"{PAGE.name}: the differences table was not found"
    return rows


def test_every_registered_difference_is_an_intended_row() -> None:
    rows = table()
    for entry in diff_known.KNOWN:
        assert entry.name in rows, f"{entry.name}: registered but not in {PAGE.name}'s table"
        if entry.pending is None:
            assert rows[entry.name].startswith("intended"), f"{entry.name}: {rows[entry.name]!r}"


def test_every_intended_row_is_registered_and_no_fixed_row_is() -> None:
    names = {entry.name for entry in diff_known.KNOWN}
    for name, status in table().items():
        if status.startswith("intended"):
            assert name in names, f"{PAGE.name}: {name} is 'intended' but not in diff_known.KNOWN"
        elif status.startswith("fixed"):
            assert name not in names, f"{PAGE.name}: {name} is 'fixed' but still registered"
        else:
            raise AssertionError(f"{PAGE.name}: {name} has status {status!r} (intended or fixed)")
