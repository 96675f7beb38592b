"""Numbers in user text (flags, layout strings, launch scripts, tool dumps), read without surprises.

``str.isdigit`` also accepts digits ``int`` refuses ('²', '٣'), and ``int`` refuses strings of more
than 4,300 digits (Python's integer-string limit); either surfaced as a traceback where user text
was checked with ``isdigit`` and converted with ``int``. ``decimal`` is that check and conversion
in one step.
"""

from __future__ import annotations

MAX_DIGITS = 18
"""Longest digit string read as a number: every count placer takes is far below 10**18, and a
longer one is reported as not a number rather than converted."""


def decimal(text: str) -> int | None:
    """``text`` as a non-negative integer when it is 1 to 18 ASCII digits, else None."""
    if 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit():
        return int(text)
    return None
