"""Every relative link of the front page and CHANGELOG.md leads to a file that exists.

The documentation pages' own links are checked by the site's build
(``make docs`` turns a link to a missing page or heading into an error); the
README and CHANGELOG.md are read on the repository's web view, outside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md"])
def test_relative_links_resolve(name: str) -> None:
    text = (ROOT / name).read_text(encoding="utf-8")
    targets = [t for t in _LINK.findall(text) if not re.match(r"^[a-z]+:", t)]
    assert name == "CHANGELOG.md" or len(targets) >= 10, f"{name}: the links into docs/ were not found"
    broken = [t for t in targets if not (ROOT / t.split("#", 1)[0]).exists()]
    assert broken == [], f"{name}: links to missing files: {broken}"


def test_the_front_page_links_every_page_of_the_site() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    pages = sorted(
        p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"
    )
    missing = [p for p in pages if f"]({p}" not in text]
    assert missing == [], f"README.md links none of {missing}"


def test_the_front_page_stays_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines: its sections belong in docs/"
    # The two set-up commands come first, as they always have.
    assert lines[2] == "```sh" and lines[3].startswith("make fuzz ") and lines[4].startswith("make test "), (
        lines[:5]
    )
