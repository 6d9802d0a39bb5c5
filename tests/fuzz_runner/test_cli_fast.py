"""``simdist --version`` and ``simdist --help`` answer without importing torch, and the
package, which now loads its public names on first use, still registers every process-wide
patch before anything can run a world.

Whether torch was imported is read from the interpreter's own import log (``-X importtime``,
``PYTHONPROFILEIMPORTTIME`` for the console script), not from simdist.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import simdist

CONSOLE_SCRIPT = Path(sys.executable).parent / "simdist"


def _imported(stderr: str) -> set[str]:
    """The modules named by an ``-X importtime`` log ("import time: self | cumulative | name")."""
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    } - {"package"}  # the log's header line


def _run_logged(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def _torch_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if m == "torch" or m.startswith("torch.")}


COMMANDS = {
    "console script": [str(CONSOLE_SCRIPT)],
    "python -m simdist": [sys.executable, "-m", "simdist"],
}


@pytest.mark.parametrize("how", sorted(COMMANDS))
@pytest.mark.parametrize("option", ["--version", "--help"])
def test_version_and_help_answer_without_importing_torch(how: str, option: str) -> None:
    if how == "console script" and not CONSOLE_SCRIPT.exists():
        pytest.skip(
            f"no console script beside {sys.executable} (simdist is not installed in this environment)"
        )
    proc = _run_logged([*COMMANDS[how], option])
    assert proc.returncode == 0, proc.stderr[-3000:]
    if option == "--version":
        assert proc.stdout.strip() == f"simdist {simdist.__version__}"
    else:
        assert proc.stdout.startswith("usage: simdist") and "demo" in proc.stdout and "fuzz" in proc.stdout
    modules = _imported(proc.stderr)
    assert "simdist.cli" in modules  # the log is read right: the command's own module is in it
    assert not _torch_modules(modules), sorted(_torch_modules(modules))[:10]


def test_the_import_log_shows_torch_once_a_public_name_is_used() -> None:
    # The control for the test above: the same reading sees torch where it is imported.
    proc = _run_logged([sys.executable, "-c", "import simdist; simdist.Layout"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch" in _imported(proc.stderr)


def test_running_a_world_registers_every_patch_however_simdist_is_reached() -> None:
    # The eager package registered every patch on `import simdist`. Lazily, whatever runs a
    # world imports simdist._run (simdist.run, the pytest plugin, torch_compat, launch): that
    # import alone must register them all, the same set as loading every public name.
    code = """
import simdist._run
from simdist._isolation import patches
reached = sorted({name for name, _, _ in patches.places()})
import simdist
simdist.run
loaded = sorted({name for name, _, _ in patches.places()})
print(reached == loaded == sorted(patches.ORDER), reached, loaded)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("True "), proc.stdout


def test_every_public_name_resolves_and_is_listed() -> None:
    assert set(simdist.__all__) <= set(dir(simdist))
    for name in simdist.__all__:
        assert getattr(simdist, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        simdist.not_a_name  # noqa: B018
    namespace: dict[str, object] = {}
    exec("from simdist import *", namespace)
    assert set(simdist.__all__) <= set(namespace)


def test_public_names_are_what_an_eager_import_bound() -> None:
    # `from .explore import explore` bound the function over the submodule of the same name;
    # lazily too, also where the submodule is imported first (the import system then binds
    # the module on the package).
    code = """
import types
import simdist.explore
import simdist
assert isinstance(simdist.explore, types.FunctionType), simdist.explore
modules = sorted(n for n in simdist.__all__ if isinstance(getattr(simdist, n), types.ModuleType))
assert modules == ["debug", "tolerance"], modules
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr[-3000:]


# Bad input to the fuzz commands is refused before torch is imported (1-2 s), as a typo
# deserves; what each refusal says is pinned where the commands are tested.
REFUSALS = {
    "fuzz, a negative budget": (["fuzz", "--budget", "-1"], 2, "expected a positive number of seconds"),
    "fuzz, an unknown option": (["fuzz", "--no-such-option"], 2, "unrecognized arguments"),
    "replay, a missing case file": (["replay", "no-such-case.json"], None, "no such file"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_the_fuzz_commands_refuse_bad_input_without_importing_torch(case: str, tmp_path: Path) -> None:
    argv, code, says = REFUSALS[case]
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "simdist", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode != 0 if code is None else proc.returncode == code, proc.stderr[-3000:]
    assert says in proc.stdout + proc.stderr
    modules = _imported(proc.stderr)
    assert "simdist.fuzz._cli" in modules  # the command's own module was reached
    assert not _torch_modules(modules), sorted(_torch_modules(modules))[:10]
