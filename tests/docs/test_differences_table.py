"""docs/differences.md's table and the registry of known differences say the same.

Every entry of ``tests/differential/diff_known.KNOWN`` (pinned by
``test_known_differences.py``) is a row of the table whose status is
"intended"; every "intended" row names an entry; a "fixed" row names none
(its difference is gone, its test is named in the row). The page's second
table, "Beyond the differential programs", names the test pinning each row.
"""

from __future__ import annotations

import re
from pathlib import Path

import diff_known

PAGE = Path(__file__).resolve().parents[2] / "docs" / "differences.md"
_ROW = re.compile(r"^\| `([a-z0-9-]+)` \|.*\| ([^|]+) \|$", re.M)
_BEYOND = "## Beyond the differential programs"


def table() -> dict[str, str]:
    text = PAGE.read_text(encoding="utf-8").split(_BEYOND)[0]
    rows = {name: status.strip() for name, status in _ROW.findall(text)}
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


def test_every_row_beyond_the_programs_names_a_test_that_exists() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert _BEYOND in text
    rows = _ROW.findall(text.split(_BEYOND)[1])
    assert len(rows) >= 5
    names = {entry.name for entry in diff_known.KNOWN}
    root = PAGE.parents[1]
    for name, pinned_by in rows:
        assert name not in names and name not in table(), f"{name}: in both tables"
        path = pinned_by.strip().strip("`")
        assert (root / path).is_file(), f"{name}: pinned by {path}, which does not exist"
