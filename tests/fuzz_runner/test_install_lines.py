"""The tutorial's install lines (docs/fuzzing.md, the block marked ``doc-test: install``)
run as written in a fresh virtualenv, in a copy of the checkout, and install this project.

Slow (a fresh virtualenv installs torch): nightly profile. torch is installed first
with the Makefile's pin (``TORCH``, default ``torch==2.13.0``), as ``make venv`` does,
so the lines resolve against the build the machines keep.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_fuzz_docs import ALL

ROOT = Path(__file__).resolve().parents[2]
INSTALL_BLOCKS = [b for b in ALL if b.mark == "install"]


def test_the_tutorial_has_one_install_block_that_installs_this_project() -> None:
    [block] = INSTALL_BLOCKS
    assert block.document.name == "fuzzing.md"
    lines = [line.split("#", 1)[0].strip() for line in block.code.splitlines()]
    installs = [line for line in lines if line.startswith("pip install")]
    # Never the bare name: "simdist" on PyPI is somebody else's package.
    assert installs and all("'simdist" not in line and " simdist" not in line for line in installs)
    assert any("'.[test]'" in line or "torch-simdist" in line for line in installs)


def test_the_distribution_is_named_torch_simdist_and_reports_its_version() -> None:
    from importlib import metadata

    from simdist.cli import DISTRIBUTION, version

    assert DISTRIBUTION == "torch-simdist"
    assert version() == metadata.version("torch-simdist")
    proc = subprocess.run(
        [sys.executable, "-m", "simdist", "--version"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"simdist {version()}", proc.stdout + proc.stderr


@pytest.mark.slow
def test_install_lines_run_as_written_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    [block] = INSTALL_BLOCKS
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(".venv*", ".git", "__pycache__", "*.egg-info", ".simdist", "build"),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    torch_pin = os.environ.get("TORCH", "torch==2.13.0")
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", torch_pin],
        check=True,
        env=env,
        timeout=1200,
    )
    for line in block.code.splitlines():
        command = line.split("#", 1)[0].strip()
        if not command:
            continue
        proc = subprocess.run(
            shlex.split(command), cwd=checkout, env=env, capture_output=True, text=True, timeout=1200
        )
        assert proc.returncode == 0, (
            f"{block.where}: `{command}` failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "show", "torch-simdist"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert installed.returncode == 0, installed.stderr
    # The user's extra only: the development tools stay out of a user's environment.
    for dev_only in ("ruff", "mypy", "megatron-core", "redis"):
        absent = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "show", "--quiet", dev_only],
            env=env,
            capture_output=True,
            timeout=120,
        )
        assert absent.returncode != 0, f"`pip install -e '.[test]'` installed {dev_only}"
