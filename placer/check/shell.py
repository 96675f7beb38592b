"""Just enough bash to read a launch script: tokens with line numbers, variables, expansion.

Launch scripts set degrees through variables (``TP=8`` then ``--tensor-model-parallel-size $TP``),
arrays (``GPT_ARGS=( ... )``), line continuations and arithmetic (``$((GPUS_PER_NODE*NNODES))``).
This reads them top to bottom as bash would, without running anything: a value that needs a
command (``$(...)``) or an outside environment variable stays unresolved (None).
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_ASSIGN_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_PARAM_RE = re.compile(
    r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARITH_RE = re.compile(r"\$\(\((.*?)\)\)")
_ARITH_OPS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod,
}
_ASSIGN_PREFIXES = ("export", "local", "declare", "readonly", "typeset")


@dataclass(frozen=True)
class Token:
    """A shell word after quote removal, the 1-based line it started on, and the variables as
    they were when bash would have expanded it."""

    text: str
    line: int
    variables: tuple[tuple[str, str | None], ...]

    def expand(self) -> str | None:
        return expand(self.text, dict(self.variables))


def _split_line(line: str) -> list[str]:
    """Words of one physical line; a quote left open across lines falls back to plain split."""
    body = line.rstrip()
    if body.endswith("\\"):
        body = body[:-1]
    try:
        return shlex.split(body, comments=True)
    except ValueError:
        body = body.split(" #", 1)[0]
        return [w for w in body.replace('"', " ").replace("'", " ").split() if w]


def tokens(text: str) -> Iterator[Token]:
    """Every word of the script in order, tracking variable assignments as bash would."""
    variables: dict[str, str | None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("#"):
            continue
        for word in _split_line(line):
            while word.endswith(")") and word.count(")") > word.count("("):
                word = word[:-1]  # the ")" closing an array: NAME=( ... last)
            if not word or word in _ASSIGN_PREFIXES:
                continue
            match = _ASSIGN_RE.match(word)
            if match and not word.startswith("-"):
                name, value = match.groups()
                if value.startswith("("):
                    value = value[1:]
                    if not value:
                        continue
                    variables.setdefault(name, None)
                    word = value
                else:
                    variables[name] = expand(value, variables)
                    continue
            yield Token(word, number, tuple(sorted(variables.items())))


def expand(text: str, variables: dict[str, str | None]) -> str | None:
    """Expand ``$X``, ``${X}``, ``${X:-d}`` and ``$((...))``; None if any part is unknown."""
    if "$(" in text.replace("$((", ""):
        return None
    unresolved = False

    def param(match: re.Match[str]) -> str:
        nonlocal unresolved
        name = match.group(1) or match.group(4)
        op, default = match.group(2), match.group(3)
        value = variables.get(name)
        if value is None or (op is not None and op.startswith(":") and value == ""):
            if op is not None:
                return expand(default or "", variables) or ""
            unresolved = True
            return ""
        return value

    def arith(match: re.Match[str]) -> str:
        nonlocal unresolved
        inner = _PARAM_RE.sub(param, match.group(1))
        inner = re.sub(r"\b[A-Za-z_][A-Za-z0-9_]*\b",
                       lambda m: variables.get(m.group(0)) or "__unknown__", inner)
        value = _arithmetic(inner)
        if value is None:
            unresolved = True
            return ""
        return str(value)

    out = _ARITH_RE.sub(arith, text)
    out = _PARAM_RE.sub(param, out)
    return None if unresolved else out


def _arithmetic(expr: str) -> int | None:
    """Integer arithmetic of ``$((...))`` (+ - * / %), evaluated without eval."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        return None

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            return _ARITH_OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(expr)

    try:
        return value(tree.body)
    except (ValueError, ZeroDivisionError):
        return None
