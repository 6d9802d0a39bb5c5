"""docs/api.md names every option the pytest marker takes and every public name.

The API reference is generated from the docstrings, but which objects it shows
and the marker's option list are written in the page: these checks keep them
complete when an option or a public name is added.
"""

from __future__ import annotations

import re
from pathlib import Path

import simdist
from simdist._run.options import OPTION_NAMES

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")


def test_the_marker_section_lists_every_run_option() -> None:
    section = PAGE[PAGE.index("## The pytest plugin") :]
    missing = [name for name in (*OPTION_NAMES, "sim_only") if f"`{name}=" not in section]
    assert missing == [], f"docs/api.md's marker options miss {missing}"


def test_every_public_name_has_an_entry() -> None:
    shown = set(re.findall(r"^\.\. auto\w+:: simdist\.(\w+)$", PAGE, re.M))
    missing = sorted(set(simdist.__all__) - shown)
    assert missing == [], f"docs/api.md has no autodoc entry for simdist.{missing}"


def test_every_constant_of_the_strategies_is_listed() -> None:
    import simdist.strategies as strategies

    constants = [name for name in strategies.__all__ if name.isupper()]
    missing = [name for name in constants if f".. autodata:: simdist.strategies.{name}\n" not in PAGE]
    assert constants and missing == [], f"docs/api.md lists no value for simdist.strategies.{missing}"
