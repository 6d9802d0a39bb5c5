"""Which project a campaign's target belongs to, its settings, and where the campaign's outputs go.

A target is fuzzed by pytest, whose rootdir is the nearest folder at or above
the targets holding a configuration file. The same folder's ``pyproject.toml``
``[tool.simdist]`` table says where that project's failing cases go, so a
campaign run from anywhere writes a user's cases into the user's project,
never into the project the command happened to be run from.

A campaign may run for hours; an output path (cases, report, JUnit) it cannot
use must be refused before the first worker starts, not discovered afterwards
with the failures it found lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CORPUS",
    "check_output_paths",
    "default_corpus",
    "display",
    "project_root",
    "simdist_settings",
]

# Where cases go when the project does not say: a folder in the target's rootdir.
DEFAULT_CORPUS = "fuzz-cases"
_CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def project_root(targets: Sequence[str]) -> Path:
    """The folder pytest would take as rootdir for ``targets`` (its ini-file rule);
    without a configuration file at or above them, the current directory."""
    paths = [Path(t.split("::", 1)[0]).resolve() for t in targets] or [Path.cwd().resolve()]
    common = Path(os.path.commonpath([str(p if p.is_dir() else p.parent) for p in paths]))
    for folder in (common, *common.parents):
        if any((folder / name).is_file() for name in _CONFIG_FILES):
            return folder
    # No project around the target: the current directory, never the target's
    # own folder (cases beside a source file in a folder that is no project).
    return Path.cwd().resolve()


def simdist_settings(root: Path) -> dict[str, Any]:
    """``[tool.simdist]`` of ``root/pyproject.toml`` ({} when absent or unreadable as TOML)."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return {}
    try:
        import tomllib  # type: ignore[import-not-found]  # 3.11+; mypy checks as 3.10
    except ImportError:  # Python 3.10
        return {}
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    table = data.get("tool", {}).get("simdist", {})
    return table if isinstance(table, dict) else {}


def default_corpus(targets: Sequence[str]) -> Path:
    """``[tool.simdist] corpus`` of the targets' project, else ``<rootdir>/fuzz-cases``."""
    root = project_root(targets)
    configured = simdist_settings(root).get("corpus")
    if isinstance(configured, str) and configured:
        return root / configured
    return root / DEFAULT_CORPUS


def display(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it, else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _existing_ancestor(path: Path) -> Path:
    for folder in (path, *path.parents):
        if folder.exists():
            return folder
    return Path(path.anchor or ".")


def _directory_problem(option: str, path: Path) -> str | None:
    if path.exists() and not path.is_dir():
        return f"{option} {path}: exists and is not a directory (cases are written into a directory)"
    base = _existing_ancestor(path.resolve())
    if not base.is_dir():
        return f"{option} {path}: {base} is not a directory"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{option} {path}: cannot create or write into it ({base} is not writable)"
    return None


def _file_problem(option: str, path: Path) -> str | None:
    if path.is_dir():
        return f"cannot write {path} ({option}): it is a directory, expected a file name"
    parent = path.parent
    if not parent.resolve().is_dir():
        return f"cannot write {path}: directory {parent} does not exist"
    if path.exists() and not os.access(path, os.W_OK):
        return f"cannot write {path} ({option}): the file is not writable"
    if not path.exists() and not os.access(parent.resolve(), os.W_OK | os.X_OK):
        return f"cannot write {path} ({option}): directory {parent} is not writable"
    return None


def check_output_paths(*, corpus: Path | None, report: Path | None, junit: Path | None) -> str | None:
    """The first reason an output path is unusable, or None."""
    if corpus is not None:
        problem = _directory_problem("--corpus", Path(corpus))
        if problem:
            return problem
    for option, path in (("--report", report), ("--junit", junit)):
        if path is not None:
            problem = _file_problem(option, Path(path))
            if problem:
                return problem
    return None
