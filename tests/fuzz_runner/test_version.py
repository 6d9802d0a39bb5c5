"""simdist's version is pyproject.toml's, wherever it is read: ``simdist.__version__``,
``simdist --version`` and the source-tree fallback (a checkout never installed)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import simdist
from simdist import _version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+: an independent reader of pyproject.toml

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


def test_dunder_version_and_the_command_say_pyprojects_version() -> None:
    assert simdist.__version__ == PYPROJECT_VERSION
    proc = subprocess.run(
        [sys.executable, "-m", "simdist", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"simdist {PYPROJECT_VERSION}"


def test_a_source_tree_without_metadata_reads_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version.metadata, "version", not_installed)
    assert _version.version() == PYPROJECT_VERSION


def test_the_fallback_is_a_pep440_local_version_when_nothing_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version.metadata, "version", not_installed)
    fake = tmp_path / "simdist" / "_version.py"
    fake.parent.mkdir()
    monkeypatch.setattr(_version, "__file__", str(fake))  # a package with no pyproject.toml beside it
    assert _version.version() == "0+unknown"
