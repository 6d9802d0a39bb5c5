"""Every code block in README.md and the documentation site (docs/**/*.md) runs as written.

Python blocks of a document run in order in one namespace, as a reader pastes
them into one session (later blocks use what earlier ones defined); a
``test_*`` Hypothesis property a block defines is run for a few examples.
A comment just above a block changes what is checked:

- ``<!-- doc-test: pytest -->``: the block is a test file, run by pytest;
- ``<!-- doc-test: excerpt PATH -->``: the block is copied verbatim from PATH
  (a file that CI runs, e.g. the tutorial's example): it must still be there;
- ``<!-- fuzzdb.py -->`` (``<!-- NAME.py -->``): the block is a module of
  its own, run alone;
- ``<!-- doc-test: skip REASON -->``: not run, for the reason given.

Shell blocks: every ``simdist ...`` line must parse with the real command
line parser (options renamed or removed fail here); running them is the job
of the campaign tests.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)
_MARK = re.compile(r"<!-- *(doc-test: *)?(.*?) *-->\s*$")


@dataclass
class Block:
    document: Path
    line: int
    language: str
    code: str
    mark: str  # "", "pytest", "excerpt PATH", "module NAME", "skip REASON"

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    text = document.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        indent, language, body = match.groups()
        code = "\n".join(line[len(indent) :] for line in body.splitlines())
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = ""
        m = _MARK.search(before)
        if m:
            mark = m.group(2) if m.group(1) else f"module {m.group(2)}"
        found.append(Block(document, text.count("\n", 0, match.start()) + 1, language, code, mark))
    return found


ALL = [b for d in DOCUMENTS for b in blocks(d)]


def _runs(b: Block) -> bool:
    """A python block this test executes (not a test file, an excerpt or a skip)."""
    return b.language == "python" and not b.mark.startswith(("skip", "pytest", "excerpt"))


# Documents with python blocks to execute; pages without any (references, tables) have nothing to run.
RUNNABLE = [d for d in DOCUMENTS if any(_runs(b) for b in ALL if b.document == d)]


def test_the_documents_have_code_blocks_and_skips_give_reasons():
    assert len(ALL) >= 8 and any(b.document.parent.name == "docs" for b in ALL)
    # The front page and the pages that teach the API show code that runs.
    for name in ("README.md", "using.md", "never-hang.md", "campaigns.md", "fuzzing.md"):
        assert any(d.name == name for d in RUNNABLE), f"{name}: no runnable python block"
    for b in ALL:
        if b.mark.startswith("skip"):
            assert len(b.mark.split(maxsplit=1)) == 2, f"{b.where}: a skip without a reason"


def _run_properties(namespace: dict, before: dict) -> None:
    """Runs, for a few examples, the Hypothesis properties the block just defined."""
    quick = settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    for name, obj in list(namespace.items()):
        fresh = before.get(name) is not obj
        if fresh and name.startswith("test_") and getattr(obj, "is_hypothesis_test", False):
            quick(obj)()


@pytest.mark.parametrize("document", RUNNABLE, ids=[d.name for d in RUNNABLE])
def test_python_blocks_run_as_written(document, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    session: dict = {"__name__": "__doc_session__"}
    ran = 0
    for b in (b for b in ALL if b.document == document and _runs(b)):
        namespace = {"__name__": "__doc_module__"} if b.mark.startswith("module") else session
        try:
            before = dict(namespace)
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(b.code, b.where, "exec"), namespace)
                _run_properties(namespace, before)
        except Exception as exc:
            raise AssertionError(
                f"{b.where}: the block fails as written: {type(exc).__name__}: {exc}"
            ) from exc
        ran += 1
    assert ran, f"{document.name}: no runnable python block"


def test_excerpts_are_still_in_the_files_they_quote():
    excerpts = [b for b in ALL if b.mark.startswith("excerpt")]
    for b in excerpts:
        source = ROOT / b.mark.split(maxsplit=1)[1]
        assert source.is_file(), f"{b.where}: quotes {source.relative_to(ROOT)}, which does not exist"
        assert b.code.strip() in source.read_text(encoding="utf-8"), (
            f"{b.where}: no longer a verbatim excerpt of {source.relative_to(ROOT)}"
        )


def test_pytest_blocks_pass_as_test_files(tmp_path):
    files = []
    for i, b in enumerate(b for b in ALL if b.mark == "pytest"):
        path = tmp_path / f"test_doc_block_{i}.py"
        path.write_text(b.code + "\n", encoding="utf-8")
        files.append(path)
    assert files
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, files)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _simdist_parser() -> argparse.ArgumentParser:
    from simdist.cli import version
    from simdist.fuzz._cli import add_fuzz_parser, add_replay_parser

    parser = argparse.ArgumentParser(prog="simdist", exit_on_error=False)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo").add_argument("--layout")
    add_fuzz_parser(sub)
    add_replay_parser(sub)
    return parser


def test_simdist_command_lines_in_shell_blocks_parse():
    parser = _simdist_parser()
    lines = [
        (b, line.split("#", 1)[0].strip())
        for b in ALL
        if b.language in ("sh", "bash", "console")
        for line in b.code.splitlines()
    ]
    commands = [(b, line) for b, line in lines if re.match(r"^(\S+=\S+ )*(simdist|python -m simdist) ", line)]
    assert commands
    for b, line in commands:
        words = shlex.split(line)
        words = words[words.index("simdist") + 1 :]
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                parser.parse_args(words)
        except SystemExit as exc:
            if exc.code not in (0, None):  # --help exits 0
                raise AssertionError(f"{b.where}: `{line}` does not parse: {err.getvalue()}") from None
        except argparse.ArgumentError as exc:
            raise AssertionError(f"{b.where}: `{line}` does not parse: {exc} {err.getvalue()}") from None
