"""Bash integer arithmetic (``$(( ))``), without eval: bash(1), "ARITHMETIC EVALUATION".

64-bit signed integers; ``/`` and ``%`` truncate toward zero as in C; a variable's value is itself
evaluated as an expression. A name with no known value makes the result unknown (None): bash
would read it as 0, but in a launch script it is usually set by the environment at run time.
Assignment operators (``x += 1``) are not evaluated (None).
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TOKEN_RE = re.compile(
    r"\s*(?:(0[xX][0-9a-fA-F]+|[0-9]+#[0-9a-zA-Z@_]+|[0-9]+)|([A-Za-z_][A-Za-z0-9_]*)"
    r"|(\*\*|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%()<>!~&|^?:]))")
# binary operators: precedence (higher binds tighter), as in bash(1)
_BINARY = {"||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6, "<": 7, ">": 7,
           "<=": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9, "*": 10, "/": 10, "%": 10,
           "**": 11}
_MAX_DEPTH = 32
_BITS = 64


class _Unknown(Exception):
    pass


def _wrap(value: int) -> int:
    value &= (1 << _BITS) - 1
    return value - (1 << _BITS) if value >> (_BITS - 1) else value


def _number(text: str) -> int:
    if "#" in text:
        base_text, digits = text.split("#", 1)
        base = int(base_text)
        if not 2 <= base <= 36:  # bases above 36 (@, _) are left unknown
            raise _Unknown
        return int(digits, base)
    if text[:2].lower() == "0x":
        return int(text, 16)
    if len(text) > 1 and text.startswith("0"):
        return int(text, 8)
    return int(text)


class _Parser:
    def __init__(self, text: str, lookup: Callable[[str], str | None], depth: int) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            match = _TOKEN_RE.match(text, pos)
            if not match or match.end() == pos:
                raise _Unknown
            number, name, op = match.groups()
            self.tokens.append(("n", number) if number else ("v", name) if name else ("o", op))
            pos = match.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0
        self.lookup, self.depth = lookup, depth

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _Unknown
        self.i += 1
        return tok

    def expr(self) -> int:
        value = self.binary(1)
        tok = self.peek()
        if tok == ("o", "?"):
            self.i += 1
            yes = self.expr()
            if self.take() != ("o", ":"):
                raise _Unknown
            no = self.expr()
            return yes if value else no
        return value

    def binary(self, level: int) -> int:
        left = self.unary()
        while True:
            tok = self.peek()
            if tok is None or tok[0] != "o" or tok[1] not in _BINARY or _BINARY[tok[1]] < level:
                return left
            op = tok[1]
            self.i += 1
            # ** is right-associative; the rest are left-associative
            right = self.binary(_BINARY[op] if op == "**" else _BINARY[op] + 1)
            left = _wrap(_apply(op, left, right))

    def unary(self) -> int:
        tok = self.take()
        if tok == ("o", "-"):
            return _wrap(-self.unary())
        if tok == ("o", "+"):
            return self.unary()
        if tok == ("o", "!"):
            return int(not self.unary())
        if tok == ("o", "~"):
            return _wrap(~self.unary())
        if tok == ("o", "("):
            value = self.expr()
            if self.take() != ("o", ")"):
                raise _Unknown
            return value
        if tok[0] == "n":
            return _wrap(_number(tok[1]))
        if tok[0] == "v":
            text = self.lookup(tok[1])
            if text is None or self.depth >= _MAX_DEPTH:
                raise _Unknown
            if not text.strip():
                return 0
            return _evaluate(text, self.lookup, self.depth + 1)
        raise _Unknown


def _apply(op: str, a: int, b: int) -> int:
    if op in ("/", "%"):
        if b == 0:
            raise _Unknown
        quotient = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return quotient if op == "/" else a - quotient * b
    if op == "**":
        if b < 0 or b > 4096:
            raise _Unknown
        return _wrap(pow(a, b, 1 << _BITS))
    if op in ("<<", ">>"):
        if b < 0 or b >= _BITS:
            raise _Unknown
        return a << b if op == "<<" else a >> b
    table: dict[str, Callable[[int, int], int]] = {
        "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "==": lambda x, y: int(x == y), "!=": lambda x, y: int(x != y),
        "<": lambda x, y: int(x < y), ">": lambda x, y: int(x > y),
        "<=": lambda x, y: int(x <= y), ">=": lambda x, y: int(x >= y),
        "&&": lambda x, y: int(bool(x) and bool(y)), "||": lambda x, y: int(bool(x) or bool(y)),
        "&": lambda x, y: x & y, "|": lambda x, y: x | y, "^": lambda x, y: x ^ y,
    }
    return table[op](a, b)


def _evaluate(text: str, lookup: Callable[[str], str | None], depth: int) -> int:
    parser = _Parser(text, lookup, depth)
    value = parser.expr()
    if parser.peek() is not None:
        raise _Unknown
    return value


def arithmetic(text: str, lookup: Callable[[str], str | None]) -> int | None:
    """Value of ``text`` as bash's ``$(( text ))``, or None if it cannot be known statically."""
    try:
        return _evaluate(text, lookup, 0) if text.strip() else 0
    except (_Unknown, ValueError, RecursionError):
        return None
