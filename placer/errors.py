"""User-facing errors: one line naming the field, the value and the fix.

Every error a user can cause (bad flag, bad file, impossible request) is a ``PlacerError``.
The CLI prints ``error: <message>`` and exits with code 2, with no traceback.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import ValidationError

USER_ERROR_EXIT_CODE = 2


class PlacerError(Exception):
    """An error caused by the user's input; its message is a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class InputError(PlacerError):
    """A field of an input has a value that cannot be used."""

    def __init__(self, field: str, value: Any, fix: str) -> None:
        self.field = field
        self.value = value
        self.fix = fix
        super().__init__(f"{field}: {short_repr(value)} is not valid; {fix}")


class InfeasibleError(PlacerError):
    """The request is well formed but no layout can satisfy it."""


def short_repr(value: Any, limit: int = 60) -> str:
    """A one-line, bounded rendering of a user value for error messages."""
    text = repr(value) if not isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


WHOLE_OBJECT_CHECKS = ("value_error", "assertion_error")
"""Error types a validator raises; with a mapping as input, a model validator's check across its
fields, whose message names them (a field validator's input is the field's own value). A message
that starts ``FIELD: `` (``pools.0.node_type: ...``) names the field within the object."""


def from_validation_error(exc: ValidationError, source: str, example: str | None = None,
                          schema: str | None = None) -> PlacerError:
    """Turn pydantic's multi-line report into one line about its first problem.

    An unknown field comes first: a misspelled required field is also reported missing under its
    right name, and the misspelling is what the user must fix; ``schema`` is the ``placer schema``
    kind whose fields it is checked against. Missing fields are named all at once (those beside
    the first), with ``example``, a command that writes a commented one. A check over a whole
    object (a model validator) names that object and its own message, not the object's repr.
    """
    errors = exc.errors(include_url=False)
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    location = ".".join(str(part) for part in first.get("loc", ()) if part != "__root__")
    field = f"{source}.{location}" if location else source
    message = str(first.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        loc = tuple(first.get("loc", ()))
        missing = [str(e["loc"][-1]) for e in errors
                   if e.get("type") == "missing" and tuple(e["loc"][:-1]) == loc[:-1]]
        close = difflib.get_close_matches(str(loc[-1]) if loc else "", missing, n=1)
        see = f"`placer schema {schema}`" if schema else "`placer schema`"
        hint = f"did you mean {close[0]!r}?" if close else f"check its spelling against {see}"
        return PlacerError(f"{field}: unknown field; {hint}")
    if first.get("type") == "missing":
        parent = tuple(first.get("loc", ()))[:-1]
        missing = [str(e["loc"][-1]) for e in errors
                   if e.get("type") == "missing" and tuple(e["loc"][:-1]) == parent]
        see = f"; `{example}` writes a commented example" if example else ""
        if len(missing) == 1:
            return PlacerError(f"{field}: required field is missing{see}")
        where = ".".join([source, *map(str, parent)])
        return PlacerError(f"{where}: required fields are missing: {', '.join(missing)}{see}")
    value = first.get("input")
    if first.get("type") in WHOLE_OBJECT_CHECKS and isinstance(value, dict):
        inner = re.match(r"([A-Za-z_]\w*(?:\.\w+)*): (.+)", message)
        if inner:  # the check names the field within the object: 'pools.0.node_type: ...'
            field, message = f"{field}.{inner.group(1)}", inner.group(2)
        return PlacerError(f"{field}: {message}")
    return PlacerError(f"{field}: {short_repr(value)} is not valid; {message}")
