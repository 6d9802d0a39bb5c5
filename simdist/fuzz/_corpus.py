"""Regression cases: one small JSON file per failure, replayable forever.

A file names the property (a pytest node id, relative to the rootdir of the
pytest run that found it, and the property file's path relative to the case
file itself, so that a corpus and its target can move together and be
replayed from anywhere), the case in the property's own JSON form, and the
error it raised when found. ``replay_case`` imports the property the way
pytest would (its directory on ``sys.path``, the ``conftest.py`` files above
it loaded first) and runs its body once with the decoded case: no search, no
shrinking.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ._property import spec_of

__all__ = ["CaseFile", "CaseFileError", "read_case", "replay_case", "write_case"]

FORMAT = "simdist-fuzz-case/1"


class CaseFileError(ValueError):
    """A regression file that cannot be read or whose property cannot be found."""


@dataclass(frozen=True)
class CaseFile:
    path: Path
    target: str
    case: dict[str, Any]
    error: dict[str, Any]
    found: dict[str, Any]
    # The property file, relative to the case file's directory (absent in
    # files written before it was recorded).
    file: str | None = None

    @property
    def file_part(self) -> str:
        return self.target.split("::", 1)[0]

    @property
    def function_part(self) -> str:
        return self.target.split("::", 1)[1] if "::" in self.target else ""


# The SIMDIST_* variables that change what a property draws or how its case
# runs; the campaign's own plumbing (worker index, run folder, budget, seeds)
# does not select a failure and is left out.
RECORDED_ENVIRONMENT = (
    "SIMDIST_FUZZ_MAX_WORLD_SIZE",
    "SIMDIST_FUZZ_CASE_TIMEOUT",
    "SIMDIST_PROFILE",
    "SIMDIST_REUSE",
    "SIMDIST_REUSE_THREADS",
    "SIMDIST_TRACE_ON_FAILURE",
)


def case_environment(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The ``RECORDED_ENVIRONMENT`` variables set in the workers' environment."""
    return {name: worker_env[name] for name in RECORDED_ENVIRONMENT if worker_env.get(name, "") != ""}


def write_case(
    directory: Path,
    target: str,
    case: Mapping[str, Any],
    error_type: str,
    error: str,
    found: Mapping[str, Any],
    property_file: Path | None = None,
    environment: Mapping[str, str] | None = None,
) -> Path:
    """Write one case file; the name is stable for the same property and case.

    ``property_file``, when known, is recorded relative to ``directory``, which
    is what lets ``simdist replay`` find the property from any directory.
    ``environment`` (see ``case_environment``) is recorded as the variables
    that were set when the failure was found."""
    directory.mkdir(parents=True, exist_ok=True)
    body = json.dumps(dict(case), sort_keys=True)
    digest = hashlib.sha1(f"{target}\n{body}".encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", target.split("::")[-1])[:60]
    path = directory / f"{name}-{digest}.json"
    data = {
        "format": FORMAT,
        "target": target,
        **({"file": _relative(property_file, directory)} if property_file is not None else {}),
        "case": dict(case),
        "error": {"type": error_type, "message": error[:4000]},
        "found": {"date": _dt.date.today().isoformat(), **dict(found)},
        **({"environment": dict(environment)} if environment else {}),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def _relative(path: Path, directory: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), Path(directory).resolve())).as_posix()


def _field(p: Path, data: dict[str, Any], key: str, kind: type, what: str, *, required: bool) -> Any:
    if key not in data:
        if required:
            raise CaseFileError(f"{p}: missing field {key!r} ({what})")
        return None
    value = data[key]
    if not isinstance(value, kind):
        raise CaseFileError(f"{p}: field {key!r} must be {what}, got {type(value).__name__} {value!r:.80}")
    return value


def read_case(path: str | Path) -> CaseFile:
    """Read and check one case file; any defect is a ``CaseFileError`` naming the file and field."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise CaseFileError(f"{p}: no such file") from None
    except OSError as exc:
        raise CaseFileError(f"{p}: not a readable JSON case file: {exc}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CaseFileError(
            f"{p}: not a readable JSON case file: not UTF-8 text "
            f"(byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CaseFileError(f"{p}: not a readable JSON case file: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CaseFileError(f'{p}: not a simdist fuzz case (expected "format": "{FORMAT}")')
    target = _field(p, data, "target", str, "a pytest node id (path::function)", required=True)
    case = _field(p, data, "case", dict, "a JSON object (the case's to_json() form)", required=True)
    error = _field(p, data, "error", dict, "a JSON object", required=False) or {}
    found = _field(p, data, "found", dict, "a JSON object", required=False) or {}
    file = _field(p, data, "file", str, "the property file's path relative to the case file", required=False)
    if "::" not in target:
        raise CaseFileError(f"{p}: target {target!r} is not a pytest node id (path::function)")
    # Only a Python file is imported to replay a case: anything else (a
    # hand-edited path to a system file) is a damaged field, not a failure.
    if not target.split("::", 1)[0].endswith(".py"):
        raise CaseFileError(
            f"{p}: field 'target' must name a Python test file (path.py::function), got {target!r:.80}"
        )
    if file is not None and not file.endswith(".py"):
        raise CaseFileError(
            f"{p}: field 'file' must be the property's Python file (a .py path relative to the case file), "
            f"got {file!r:.80}"
        )
    return CaseFile(p, target, case, error, found, file)


def _locate(case: CaseFile, root: Path | None) -> Path:
    rel = Path(case.file_part)
    candidates = [root / rel] if root is not None else []
    if case.file is not None:
        # Recorded by the campaign: right wherever the replay runs from.
        candidates.append(case.path.resolve().parent / case.file)
    candidates.append(Path.cwd() / rel)
    # A corpus usually lives in the same repository as its properties.
    candidates += [parent / rel for parent in case.path.resolve().parents]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise CaseFileError(
        f"{case.path}: property file {case.file_part} not found (from {Path.cwd().name}/ or above the case file)"
    )


def _import_like_pytest(path: Path) -> Any:
    """Import a test file as pytest's default ("prepend") import mode does."""
    base = path.parent
    parts = [path.stem]
    while (base / "__init__.py").exists():
        parts.insert(0, base.name)
        base = base.parent
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    _load_conftests(path.parent, base)
    name = ".".join(parts)
    module = sys.modules.get(name)
    if module is not None and Path(getattr(module, "__file__", "")).resolve() == path:
        return module
    return importlib.import_module(name)


def _load_conftests(directory: Path, base: Path) -> None:
    """Load conftest.py files from the outermost down, as pytest does before a test module."""
    chain = [d for d in [directory, *directory.parents] if (d / "conftest.py").exists()]
    for d in reversed(chain):
        conftest = (d / "conftest.py").resolve()
        if any(
            Path(getattr(m, "__file__", "") or "").resolve() == conftest
            for m in list(sys.modules.values())
            if getattr(m, "__file__", None)
        ):
            continue
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
        name = f"_simdist_replay_conftest_{hashlib.sha1(str(conftest).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, conftest)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def replay_case(path: str | Path, *, root: Path | None = None) -> None:
    """Run the case in ``path`` once; raises whatever the property raises."""
    case = read_case(path)
    module = _import_like_pytest(_locate(case, root))
    name = case.function_part.split("[", 1)[0]
    if "::" in name:
        raise CaseFileError(f"{case.path}: {case.target}: only module-level properties can be replayed")
    obj = getattr(module, name, None)
    if obj is None:
        raise CaseFileError(f"{case.path}: {case.target}: {name!r} not found in {module.__name__}")
    spec = spec_of(obj)
    if spec is None:
        raise CaseFileError(f"{case.path}: {case.target} is not a @simdist.fuzz.replayable property")
    # Run the body under Hypothesis with exactly this case, so that event()
    # and target() calls inside it work as in the campaign; nothing is searched.
    try:
        decoded = spec.decode(case.case)
    except Exception as exc:
        # A case the property cannot read back is a damaged file, not a
        # failure of the property: it says nothing about the code.
        raise CaseFileError(
            f"{case.path}: field 'case' cannot be decoded by "
            f"{getattr(spec.decode, '__qualname__', spec.decode)!s}: {type(exc).__name__}: {exc}"
        ) from exc
    once = settings(
        database=None,
        phases=[Phase.generate],
        max_examples=1,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    once(given(**{spec.arg: st.just(decoded)})(obj.hypothesis.inner_test))()
