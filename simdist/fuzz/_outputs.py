"""The files a campaign writes (cases, report, JUnit): checked before it starts.

A campaign may run for hours; an output path it cannot use must be refused
before the first worker starts, not discovered afterwards with the failures
it found lost.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["check_output_paths", "display"]


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
