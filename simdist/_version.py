"""simdist's version: the installed distribution's, else the source tree's pyproject.toml."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "version"]

# The distribution's name on a package index; the import name is simdist
# ("simdist" on PyPI is an unrelated project).
DISTRIBUTION = "torch-simdist"

# Read without tomllib (Python 3.10 has none): the [project] table's version line.
_PROJECT_VERSION = re.compile(r'^\[project\]\s*$(?:(?!^\[).)*?^version\s*=\s*"([^"]+)"', re.M | re.S)


def version() -> str:
    """The version pip installed (the distribution's metadata). Imported from a
    checkout that was never installed there is no metadata: the checkout's
    pyproject.toml says it, else ``0+unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        match = _PROJECT_VERSION.search(pyproject.read_text(encoding="utf-8"))
    except OSError:
        match = None
    return match.group(1) if match else "0+unknown"
