"""The tutorial's install lines (docs/fuzzing.md, the block marked ``doc-test: install``)
run as written in a fresh virtualenv, in a copy of the checkout, and install this project
from its wheel: simdist alone, without the repository's draft_loss.

The lines run unmodified; only where torch comes from differs:

- by default (CI), the fresh virtualenv sees the running environment's torch the way a
  user's own build is seen (a path entry holding torch and its requirements, and nothing
  else of this environment): the tutorial's CPU-torch line then finds torch installed and
  does nothing, as it says ("skip it where torch is installed");
- in the nightly profile, also with torch installed into the fresh virtualenv by pip, with
  the Makefile's pin (``TORCH``, default ``torch==2.13.0``) as ``make venv`` does: pip
  resolves the project against a torch in the virtualenv's own site-packages.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
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


# The running environment's development tools: the user's extra must not bring them.
DEV_ONLY = ("ruff", "mypy", "megatron-core", "redis")


def _torch_and_its_requirements() -> list[metadata.Distribution]:
    """torch's distribution here and those its requirements name, transitively (no extras)."""
    found: dict[str, metadata.Distribution] = {}
    todo = ["torch"]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found[name] = dist = metadata.distribution(name)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return list(found.values())


def _make_torch_visible(venv: Path, where: Path) -> None:
    """Lets ``venv`` see this environment's torch as a user's own build is seen: a path entry
    (``where``, named by a .pth file) holding links to torch and its requirements, files and
    metadata, and nothing else of this environment."""
    where.mkdir()
    for dist in _torch_and_its_requirements():
        assert dist.files is not None, f"{dist.metadata['Name']} has no RECORD: cannot tell its files"
        site = Path(str(dist.locate_file("")))
        for top in sorted({f.parts[0] for f in dist.files} - {"..", "__pycache__"}):
            if not top.endswith(".pth") and (site / top).exists() and not (where / top).exists():
                (where / top).symlink_to(site / top)
    [site_packages] = (venv / "lib").glob("python*/site-packages")
    (site_packages / "torch-of-the-user.pth").write_text(f"{where}\n", encoding="utf-8")


def _ask(
    venv: Path, env: dict[str, str], code: str, names: tuple[str, ...], cwd: Path | None = None
) -> dict[str, str | None]:
    """``code`` run by the fresh virtualenv's interpreter with ``names`` as arguments: its JSON answer."""
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code, *names],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found: dict[str, str | None] = json.loads(proc.stdout)
    return found


def _installed(venv: Path, env: dict[str, str], names: tuple[str, ...]) -> dict[str, str | None]:
    """Each distribution's location as the fresh virtualenv's interpreter finds it (None: absent)."""
    code = (
        "import json, sys\nfrom importlib import metadata\nout = {}\nfor n in sys.argv[1:]:\n"
        "    try: out[n] = str(metadata.distribution(n).locate_file(''))\n"
        "    except metadata.PackageNotFoundError: out[n] = None\nprint(json.dumps(out))"
    )
    return _ask(venv, env, code, names)


def _importable(venv: Path, env: dict[str, str], cwd: Path, names: tuple[str, ...]) -> dict[str, str | None]:
    """Where the fresh virtualenv's interpreter imports each module from, run
    outside the checkout (None: not importable)."""
    code = (
        "import importlib.util, json, sys\nout = {}\nfor n in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(n)\n    out[n] = spec.origin if spec else None\n"
        "print(json.dumps(out))"
    )
    return _ask(venv, env, code, names, cwd)


@pytest.mark.parametrize("torch_from", ["visible", pytest.param("pip", marks=pytest.mark.slow)])
def test_install_lines_run_as_written_in_a_fresh_virtualenv(tmp_path: Path, torch_from: str) -> None:
    [block] = INSTALL_BLOCKS
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT,
        checkout,
        ignore=shutil.ignore_patterns(
            ".venv*", ".git", "__pycache__", "*.egg-info", ".simdist", "build", ".*_cache", ".hypothesis"
        ),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    if torch_from == "visible":
        _make_torch_visible(venv, tmp_path / "torch-of-the-user")
    else:
        torch_pin = os.environ.get("TORCH", "torch==2.13.0")
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", torch_pin],
            check=True,
            env=env,
            timeout=1200,
        )
    torch_before = _installed(venv, env, ("torch",))["torch"]
    assert torch_before is not None
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
    found = _installed(venv, env, ("torch-simdist", "torch", *DEV_ONLY))
    assert found["torch-simdist"] is not None, found
    # Installed from the wheel: simdist in the virtualenv, not a link to the checkout;
    # draft_loss (this repository's system under test) is not put into users' environments.
    where = _importable(venv, env, tmp_path, ("simdist", "draft_loss"))
    assert where["simdist"] is not None and Path(where["simdist"]).is_relative_to(venv), where
    assert where["draft_loss"] is None, f"the wheel installed draft_loss: {where}"
    # The CPU-torch line found torch installed and left it where it was.
    assert found["torch"] == torch_before, found
    # The user's extra only: the development tools stay out of a user's environment.
    leaked = [name for name in DEV_ONLY if found[name] is not None]
    assert not leaked, f"the tutorial's install lines installed {leaked}: {found}"
