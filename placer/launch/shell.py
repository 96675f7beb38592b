"""Shell-safe rendering of values that come from input files (host names, job names, paths).

Every value that lands in a generated script is checked against a pattern first (so a hostile or
mistyped plan fails with one clear error instead of producing a script that does something else)
and then quoted with ``shlex.quote`` (so even an allowed value cannot be re-parsed by the shell).
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Iterable

from placer.errors import InputError
from placer.spec.cluster import HOSTNAME_PATTERN, IFNAME_PATTERN, NAME_PATTERN
from placer.spec.job import JOB_NAME_PATTERN

# A path for the training script: printable, no control characters, not an option.
SCRIPT_PATTERN = r"^[^\x00-\x1f\x7f-][^\x00-\x1f\x7f]{0,1023}$"
ENV_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]*$"

PATTERNS = {
    "hostname": HOSTNAME_PATTERN,
    "ifname": IFNAME_PATTERN,
    "name": NAME_PATTERN,
    "job": JOB_NAME_PATTERN,
    "script": SCRIPT_PATTERN,
    "env": ENV_NAME_PATTERN,
}

_FIXES = {
    "hostname": "use letters, digits, '.' and '-' (RFC 1123)",
    "ifname": "use interface names such as eth0 or ^docker,lo (NCCL_SOCKET_IFNAME syntax)",
    "name": "use letters, digits, '.', '_', '+' and '-'",
    "job": "use letters, digits, '.', '_' and '-' (at most 63 characters)",
    "script": "give a path without control characters that does not start with '-'",
    "env": "use upper-case letters, digits and '_'",
}


def checked(value: str, kind: str, field: str) -> str:
    """``value`` unchanged if it matches the pattern of ``kind``; else an InputError."""
    if not isinstance(value, str) or not re.fullmatch(PATTERNS[kind], value):
        raise InputError(field, value, _FIXES[kind])
    return value


def quote(value: str | int, kind: str | None = None, field: str = "value") -> str:
    """Validate (when ``kind`` is given) and shell-quote one value."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if kind is not None:
        checked(value, kind, field)
    return shlex.quote(value)


def bash_array(values: Iterable[str | int]) -> str:
    """``('a' 'b c' 3)``: a bash array literal of already validated values.

    Strings are always single-quoted, so a value such as ``0,1`` reads as one element (to the
    shell and to shellcheck, which warns about commas in unquoted array elements).
    """
    def element(value: str | int) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return single_quoted(value)

    return "(" + " ".join(element(v) for v in values) + ")"


def single_quoted(value: str) -> str:
    """Always single-quote (``shlex.quote`` leaves ``=a,b`` bare, which shellcheck flags)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def comment_block(lines: Iterable[str], width: int = 98) -> list[str]:
    """``#`` comment lines (shell, TOML, YAML), wrapped; an empty string gives a bare ``#``."""
    out: list[str] = []
    for line in lines:
        wrapped = textwrap.wrap(line, width=width - 2, subsequent_indent="  ",
                                break_long_words=False, break_on_hyphens=False)
        out += [f"# {w}" for w in wrapped] or ["#"]
    return out
