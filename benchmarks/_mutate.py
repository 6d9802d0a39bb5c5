"""Mutants of a Python package's source, generated from its ``ast``.

Each mutant is one small textual edit of one file (the rest of the file is
left byte for byte, so line numbers and tracebacks still match the
original), identified by ``<module>:<line>:<col>:<operator>``: the same
source always gives the same mutants, in the same order, with the same ids.

Operators: arithmetic (``+``/``-``, ``*``/``/``, also in augmented
assignments), comparisons (``<``/``<=``, ``>``/``>=``, ``==``/``!=``,
``is``/``is not``, ``in``/``not in``), ``and``/``or``, removing a ``not``,
integer constants (n -> n+1, 1 -> 0), ``min``/``max`` (also ``amin``/``amax``,
``minimum``/``maximum``), ``ReduceOp`` MAX/MIN and SUM -> MAX, dropping one
simple statement (an augmented assignment, a call used as a statement),
and swapping the two values of a ``torch.where``.

Never mutated: docstrings and every string constant, type annotations,
f-strings (error messages), and every line of a ``raise`` statement.
Mutants that do not compile, and mutants that compile to the same code as an
earlier mutant of the same file (a duplicate), are left out. Each mutant is
tagged with what its context says about a survivor: inside an error path
(an ``except`` body, an ``assert``, an ``if`` that raises) and the rule by
which it is likely equivalent, if one applies.

Imported by bare name: benchmarks/mutation.py has this folder first on its path.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import CodeType
from typing import Any

Position = tuple[int, int]  # (line from 1, column in characters from 0)

_BINARY = {ast.Add: ("+", "-", "add-sub"), ast.Sub: ("-", "+", "sub-add")}
_BINARY |= {ast.Mult: ("*", "/", "mul-div"), ast.Div: ("/", "*", "div-mul")}
_COMPARE: dict[type, tuple[str, str, str]] = {
    ast.Lt: ("<", "<=", "lt-le"),
    ast.LtE: ("<=", "<", "le-lt"),
    ast.Gt: (">", ">=", "gt-ge"),
    ast.GtE: (">=", ">", "ge-gt"),
    ast.Eq: ("==", "!=", "eq-ne"),
    ast.NotEq: ("!=", "==", "ne-eq"),
    ast.Is: ("is", "is not", "is-isnot"),
    ast.IsNot: ("is not", "is", "isnot-is"),
    ast.In: ("in", "not in", "in-notin"),
    ast.NotIn: ("not in", "in", "notin-in"),
}
_BOOLEAN = {ast.And: ("and", "or", "and-or"), ast.Or: ("or", "and", "or-and")}
# Calls whose name is swapped: builtins and tensor methods / torch functions alike.
_EXTREMA = {"min": "max", "max": "min", "amin": "amax", "amax": "amin"}
_EXTREMA |= {"minimum": "maximum", "maximum": "minimum"}
_REDUCE_OPS = {"MAX": "MIN", "MIN": "MAX", "SUM": "MAX"}

# The rules by which a mutant is tagged likely equivalent: the change cannot alter any value.
EQUIVALENCE_RULES = {
    "compiles-identically": "the mutant compiles to the original's bytecode (trivial compiler equivalence)",
    "identity-operand": "x + 0 and x - 0, x * 1 and x / 1 give the same value (up to the sign of a zero)",
}


@dataclass(frozen=True)
class Edit:
    """Replace the text from ``start`` to ``end`` (exclusive) with ``text``."""

    start: Position
    end: Position
    text: str


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str  # relative to the tree's root, with forward slashes
    line: int
    col: int  # from 1, as editors count
    operator: str
    description: str  # e.g. "< -> <="
    lines: tuple[int, int]  # the mutated node's first and last line: reached if either runs
    edits: tuple[Edit, ...]
    error_path: bool
    equivalent: str | None  # the rule that says the change cannot alter any value, if one does
    source: str = field(repr=False)


@dataclass(frozen=True)
class _Candidate:
    operator: str
    description: str
    anchor: Position
    node: ast.AST
    edits: tuple[Edit, ...]
    error_path: bool
    equivalent: str | None = None


class _Text:
    """The file's text by lines, with ast's byte columns turned into characters."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))

    def char_col(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1]
        return byte_col if text.isascii() else len(text.encode()[:byte_col].decode())

    def start(self, node: Any) -> Position:
        return node.lineno, self.char_col(node.lineno, node.col_offset)

    def end(self, node: Any) -> Position:
        return node.end_lineno, self.char_col(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        return self.source[self.offset(self.start(node)) : self.offset(self.end(node))]

    def offset(self, position: Position) -> int:
        return self.starts[position[0] - 1] + position[1]

    def between(self, after: Position, before: Position) -> list[tokenize.TokenInfo]:
        """Operator and keyword tokens between two positions (brackets left out:
        parentheses around an operand belong to the operand)."""
        return [
            tok
            for tok in self.tokens
            if tok.start >= after
            and tok.end <= before
            and tok.type in (tokenize.OP, tokenize.NAME)
            and tok.string not in "()"
        ]

    def apply(self, edits: Sequence[Edit]) -> str:
        text = self.source
        for edit in sorted(edits, key=lambda e: e.start, reverse=True):
            text = text[: self.offset(edit.start)] + edit.text + text[self.offset(edit.end) :]
        return text


def _token_edit(tokens: Sequence[tokenize.TokenInfo], old: str, new: str) -> Edit | None:
    """The edit replacing the operator ``old`` (one or two tokens, e.g. ``is not``) by ``new``."""
    if not tokens or " ".join(tok.string for tok in tokens) != old:
        return None
    return Edit(tokens[0].start, tokens[-1].end, new)


def _is_literal(node: ast.AST, value: float) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == value


def _raise_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _raises(body: Sequence[ast.stmt]) -> bool:
    return any(isinstance(stmt, ast.Raise) for stmt in body)


class _Finder(ast.NodeVisitor):
    """Walks one module and collects every candidate mutation, skipping what is never mutated."""

    def __init__(self, text: _Text, tree: ast.Module) -> None:
        self.text = text
        self.skip_lines = _raise_lines(tree)
        self.error_depth = 0
        self.found: list[_Candidate] = []

    # ---- context: what is never visited, what counts as an error path

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # f-strings: messages and names, never values worth mutating

    def visit_arg(self, node: ast.arg) -> None:
        return  # only its annotation lies below

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._visit_all([node.target, node.value])

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._visit_all([*node.decorator_list, node.args, *node.body])  # the return annotation left out

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):
            return  # a docstring, or a bare constant
        if isinstance(node.value, ast.Call):
            self._add(node, "drop-call", "drop the call statement", self._drop(node))
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._in_error_path([node.type, *node.body])

    def visit_Assert(self, node: ast.Assert) -> None:
        self._in_error_path([node.test])

    def visit_If(self, node: ast.If) -> None:
        if _raises(node.body):  # a validation branch: its test and body
            self._in_error_path([node.test, *node.body])
            self._visit_all(node.orelse)
        else:
            self.generic_visit(node)

    def _in_error_path(self, nodes: Sequence[ast.AST | None]) -> None:
        self.error_depth += 1
        try:
            self._visit_all(nodes)
        finally:
            self.error_depth -= 1

    def _visit_all(self, nodes: Sequence[ast.AST | None]) -> None:
        for child in nodes:
            if child is not None:
                self.visit(child)

    # ---- the operators

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if type(node.op) in _BINARY and not self._stringy(node):
            old, new, name = _BINARY[type(node.op)]
            tokens = self.text.between(self.text.end(node.left), self.text.start(node.right))
            edit = _token_edit(tokens, old, new)
            identity = 0 if name in ("add-sub", "sub-add") else 1
            rule = "identity-operand" if _is_literal(node.right, identity) else None
            self._add(
                node, name, f"{old} -> {new}", (edit,) if edit else (), self.text.start(node.right), rule
            )
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._add(node, "drop-augassign", "drop the augmented assignment", self._drop(node))
        if type(node.op) in _BINARY:
            old, new, name = _BINARY[type(node.op)]
            tokens = self.text.between(self.text.end(node.target), self.text.start(node.value))
            edit = _token_edit(tokens, old + "=", new + "=")
            self._add(node, name, f"{old}= -> {new}=", (edit,) if edit else (), self.text.start(node.value))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        left: ast.AST = node.left
        for op, right in zip(node.ops, node.comparators):
            if type(op) in _COMPARE:
                old, new, name = _COMPARE[type(op)]
                tokens = self.text.between(self.text.end(left), self.text.start(right))
                edit = _token_edit(tokens, old, new)
                self._add(node, name, f"{old} -> {new}", (edit,) if edit else (), self.text.start(right))
            left = right
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        old, new, name = _BOOLEAN[type(node.op)]
        edits = []
        for before, after in zip(node.values, node.values[1:]):
            edit = _token_edit(self.text.between(self.text.end(before), self.text.start(after)), old, new)
            if edit is None:
                break
            edits.append(edit)
        complete = len(edits) == len(node.values) - 1
        self._add(
            node, name, f"{old} -> {new}", tuple(edits) if complete else (), self.text.start(node.values[1])
        )
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            start = self.text.start(node)
            tokens = self.text.between(start, self.text.start(node.operand))
            if tokens and tokens[0].string == "not":
                end = tokens[0].end
                if self.text.lines[end[0] - 1][end[1] : end[1] + 1] == " ":
                    end = (end[0], end[1] + 1)
                self._add(node, "not-drop", "not x -> x", (Edit(start, end, ""),))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if type(node.value) is not int:
            return  # strings, floats, bools, None: left alone
        span = (self.text.start(node), self.text.end(node))
        value = node.value
        self._add(node, "int-inc", f"{value} -> {value + 1}", (Edit(*span, str(value + 1)),))
        if value == 1:
            self._add(node, "int-1to0", "1 -> 0", (Edit(*span, "0"),))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("min", "max"):
            swapped = _EXTREMA[func.id]
            edit = Edit(self.text.start(func), self.text.end(func), swapped)
            self._add(func, f"{func.id}-{swapped}", f"{func.id}( -> {swapped}(", (edit,))
        elif isinstance(func, ast.Attribute) and func.attr in _EXTREMA:
            self._rename_attribute(func, _EXTREMA[func.attr])
        if self._is_torch_where(node):
            _, a, b = node.args
            text_a, text_b = self.text.segment(a), self.text.segment(b)
            edits = (
                Edit(self.text.start(a), self.text.end(a), text_b),
                Edit(self.text.start(b), self.text.end(b), text_a),
            )
            self._add(node, "where-swap", "torch.where(c, a, b) -> torch.where(c, b, a)", edits)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        owner = node.value
        named = isinstance(owner, ast.Attribute) and owner.attr == "ReduceOp"
        if (named or (isinstance(owner, ast.Name) and owner.id == "ReduceOp")) and node.attr in _REDUCE_OPS:
            self._rename_attribute(node, _REDUCE_OPS[node.attr], prefix="reduceop-")
        self.generic_visit(node)

    # ---- helpers

    def _rename_attribute(self, node: ast.Attribute, new: str, prefix: str = "") -> None:
        end = self.text.end(node)
        start = (end[0], end[1] - len(node.attr))
        operator = f"{prefix}{node.attr}-{new}".lower()
        self._add(node, operator, f".{node.attr} -> .{new}", (Edit(start, end, new),), start)

    @staticmethod
    def _is_torch_where(node: ast.Call) -> bool:
        func = node.func
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "where"
            and isinstance(func.value, ast.Name)
            and func.value.id == "torch"
            and len(node.args) == 3
            and not node.keywords
            and not any(isinstance(arg, ast.Starred) for arg in node.args)
        )

    @staticmethod
    def _stringy(node: ast.BinOp) -> bool:
        """String building (``"a" + b``, ``"%s" % x``): messages, not values."""
        sides = (node.left, node.right)
        return any(
            isinstance(s, ast.JoinedStr | ast.Constant) and isinstance(getattr(s, "value", ""), str)
            for s in sides
        )

    def _drop(self, stmt: ast.stmt) -> tuple[Edit, ...]:
        """``pass`` in place of the statement, keeping the line count."""
        start, end = self.text.start(stmt), self.text.end(stmt)
        return (Edit(start, end, "pass" + "\n" * (end[0] - start[0])),)

    def _add(
        self,
        node: ast.AST,
        operator: str,
        description: str,
        edits: tuple[Edit, ...],
        anchor: Position | None = None,
        equivalent: str | None = None,
    ) -> None:
        anchor = anchor or self.text.start(node)
        if not edits or anchor[0] in self.skip_lines:
            return
        error_path = self.error_depth > 0
        self.found.append(_Candidate(operator, description, anchor, node, edits, error_path, equivalent))


# ------------------------------------------------------------- compiled code


def _signature(code: CodeType) -> tuple[Any, ...]:
    """What the code does, without where it came from (line and column tables):
    two sources with the same signature compile to the same program."""
    consts = tuple(
        _signature(c) if isinstance(c, CodeType) else (type(c).__name__, repr(c)) for c in code.co_consts
    )
    shape = (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags)
    names = (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
    return (code.co_code, consts, names, shape)


def _compiled(source: str, path: str) -> tuple[Any, ...] | None:
    try:
        return _signature(compile(source, path, "exec", dont_inherit=True))
    except (SyntaxError, ValueError):
        return None


# --------------------------------------------------------------- the public API


def module_name(path: str) -> str:
    """``draft_loss/cotrain/worker.py`` -> ``cotrain/worker``: the package stays out of the id."""
    parts = path.removesuffix(".py").split("/")
    return "/".join(parts[1:] if len(parts) > 1 else parts)


def mutants_of_source(source: str, path: str) -> list[Mutant]:
    """Every mutant of one file's text, in (line, column, operator) order."""
    text = _Text(source)
    tree = ast.parse(source, filename=path)
    finder = _Finder(text, tree)
    finder.visit(tree)
    original = _compiled(source, path)
    seen: set[tuple[Any, ...]] = set()
    out: list[Mutant] = []
    for cand in sorted(finder.found, key=lambda c: (c.anchor, c.operator)):
        mutated = text.apply(cand.edits)
        compiled = _compiled(mutated, path)
        if mutated == source or compiled is None or compiled in seen:
            continue  # no change, does not compile, or the same program as an earlier mutant
        seen.add(compiled)
        line, col = cand.anchor
        node: Any = cand.node
        equivalent = "compiles-identically" if compiled == original else cand.equivalent
        out.append(
            Mutant(
                id=f"{module_name(path)}:{line}:{col + 1}:{cand.operator}",
                path=path,
                line=line,
                col=col + 1,
                operator=cand.operator,
                description=cand.description,
                lines=(node.lineno, node.end_lineno or node.lineno),
                edits=cand.edits,
                error_path=cand.error_path,
                equivalent=equivalent,
                source=mutated,
            )
        )
    return _unique(out)


def _unique(mutants: list[Mutant]) -> list[Mutant]:
    """Two mutations at one place with one operator (rare: nested nodes starting
    together) get ``#2``, ``#3``... in order, so every id names one mutant."""
    counts: dict[str, int] = {}
    out = []
    for m in mutants:
        counts[m.id] = counts.get(m.id, 0) + 1
        if counts[m.id] > 1:
            m = replace(m, id=f"{m.id}#{counts[m.id]}")
        out.append(m)
    return out


def package_files(root: Path, package: str = "draft_loss") -> list[str]:
    """The package's Python files, relative to ``root``, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in (root / package).rglob("*.py"))


def mutants_of_tree(root: Path, files: Sequence[str]) -> Iterator[Mutant]:
    """The mutants of ``files`` (relative to ``root``), file by file in the given order."""
    for path in files:
        yield from mutants_of_source((root / path).read_text(encoding="utf-8"), path)
