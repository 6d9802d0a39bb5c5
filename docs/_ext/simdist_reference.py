"""Reference pages generated from the code and data they describe.

- ``simdist-cli``: the command-line reference, from the real parser;
- ``simdist-pytest-options``: the pytest plugin's options, from its ``pytest_addoption``;
- ``simdist-schema PATH``: a JSON Schema's fields as a table, from the schema file.

The command line:

``simdist.cli.main`` builds its parser (with the ``fuzz`` and ``replay``
subcommands, which it adds only when asked for one) and parses. The directive
runs ``main(["fuzz"])`` with ``ArgumentParser.parse_args`` replaced by a trap
that hands back the parser it was called on, so the page shows exactly the
options, defaults and help texts the installed command has, with no copy of
them to keep in step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Parser as RstParser
from docutils.utils import new_document
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


def _rst(directive: SphinxDirective, lines: list[str], source: str) -> list[nodes.Node]:
    """Nodes of generated reStructuredText, whatever the page's own markup (these pages are MyST)."""
    document = new_document(source, directive.state.document.settings)
    RstParser().parse("\n".join(lines) + "\n", document)
    return list(document.children)


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser caught")
        self.parser = parser


def simdist_parser() -> argparse.ArgumentParser:
    """The top-level ``simdist`` parser, every subcommand added, as ``main`` builds it."""
    from simdist import cli

    original = argparse.ArgumentParser.parse_args

    def trap(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Caught(self)

    argparse.ArgumentParser.parse_args = trap  # type: ignore[method-assign]
    try:
        cli.main(["fuzz"])
    except _Caught as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise RuntimeError("simdist.cli.main returned without parsing its arguments")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _literal(text: str) -> list[str]:
    return ["::", "", *("   " + line for line in text.splitlines()), ""]


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows: list[str] = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or action.dest.upper()
                if isinstance(metavar, tuple):
                    metavar = " ".join(metavar)
                names += f" {metavar}"
        else:
            names = str(action.metavar or action.dest)
        text = (action.help or "").replace("%(default)s", str(action.default)).replace("%%", "%")
        if action.choices and not isinstance(action.choices, dict):
            text += " Choices: " + ", ".join(f"``{c}``" for c in action.choices) + "."
        default = action.default
        if (
            action.option_strings
            and action.nargs != 0
            and default not in (None, argparse.SUPPRESS, [], "")
            and "default" not in text
        ):
            text += f" Default: ``{default}``."
        rows.append(f"``{names}``")
        rows.append(f"   {text.strip() or '(no help text)'}")
        rows.append("")
    return rows


class SimdistCli(SphinxDirective):
    """Renders ``simdist``'s usage, then every subcommand with its options."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        parser = simdist_parser()
        lines: list[str] = []
        lines += _literal(parser.format_usage())
        if parser.description:
            lines += [parser.description.strip(), ""]
        for name, sub in _subparsers(parser).items():
            title = f"simdist {name}"
            lines += [title, "-" * len(title), ""]
            summary = _help_of(parser, name)
            if summary:
                lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
            lines += _literal(sub.format_usage())
            if sub.description:
                lines += [sub.description.strip(), ""]
            lines += _option_rows(sub)
            if sub.epilog:
                lines += [sub.epilog.strip(), ""]
        return _rst(self, lines, "simdist.cli")


class _OptionRecorder:
    """Stands in for pytest's parser: records what the plugin's ``pytest_addoption`` adds."""

    def __init__(self) -> None:
        self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def getgroup(self, name: str, description: str = "") -> _OptionRecorder:
        return self

    def addoption(self, *names: str, **attrs: Any) -> None:
        self.options.append((names, attrs))


class SimdistPytestOptions(SphinxDirective):
    """Lists the command-line options simdist's pytest plugin adds, from the plugin itself."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from simdist._pytest import plugin

        recorder = _OptionRecorder()
        plugin.pytest_addoption(recorder)  # type: ignore[arg-type]
        lines: list[str] = []
        for names, attrs in recorder.options:
            head = ", ".join(names)
            if attrs.get("metavar"):
                head += f" {attrs['metavar']}"
            elif attrs.get("choices"):
                head += " {" + ",".join(attrs["choices"]) + "}"
            elif attrs.get("type") is float:
                head += " SECONDS"
            lines += [f"``{head}``", f"   {attrs.get('help', '(no help text)')}", ""]
        return _rst(self, lines, "simdist._pytest.plugin")


def _type_of(spec: dict[str, Any]) -> str:
    if "const" in spec:
        return f"``{json.dumps(spec['const'])}``"
    if "enum" in spec:
        return " | ".join(f"``{json.dumps(v)}``" for v in spec["enum"])
    if "$ref" in spec:
        return "object" if spec["$ref"].endswith("counts") else spec["$ref"].rsplit("/", 1)[-1]
    if "allOf" in spec:
        return "object"
    kind = spec.get("type", "any")
    kinds = kind if isinstance(kind, list) else [kind]
    if "array" in kinds and isinstance(spec.get("items"), dict) and "$ref" in spec["items"]:
        kinds = [k if k != "array" else f"array of {spec['items']['$ref'].rsplit('/', 1)[-1]}" for k in kinds]
    return " or ".join(kinds)


def _schema_rows(props: dict[str, Any], required: set[str], prefix: str = "") -> list[tuple[str, str, str]]:
    rows = []
    for name, spec in props.items():
        field = f"{prefix}{name}"
        need = "" if name in required else " (optional)"
        rows.append((f"``{field}``{need}", _type_of(spec), spec.get("description", "")))
        if isinstance(spec.get("properties"), dict):
            rows += _schema_rows(spec["properties"], set(spec.get("required", [])), f"{field}.")
    return rows


class SimdistSchema(SphinxDirective):
    """A table of a JSON Schema's fields (nested objects and ``$defs`` included)."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        path = Path(self.env.srcdir) / self.arguments[0]
        self.env.note_dependency(str(path))
        schema = json.loads(path.read_text(encoding="utf-8"))
        rows = _schema_rows(schema.get("properties", {}), set(schema.get("required", [])))
        for name, spec in schema.get("$defs", {}).items():
            if isinstance(spec.get("properties"), dict):
                rows += _schema_rows(spec["properties"], set(spec.get("required", [])), f"{name}.")
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 25 15 60", ""]
        lines += ["   * - field", "     - type", "     - meaning"]
        for field, kind, text in rows:
            lines += [f"   * - {field}", f"     - {kind}", f"     - {text or '-'}"]
        lines.append("")
        return _rst(self, lines, str(path))


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("simdist-schema", SimdistSchema)
    app.add_directive("simdist-cli", SimdistCli)
    app.add_directive("simdist-pytest-options", SimdistPytestOptions)
    return {"version": "1", "parallel_read_safe": True}
