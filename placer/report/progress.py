"""Progress on stderr for work that takes longer than a second: a spinner or plain lines.

Quick runs stay silent. On a terminal a spinner shows what is being done; anywhere else (a pipe,
a CI log, a file) each step still running after the delay gets one plain line, ``placer: ...``,
so a long search in a log is never a silent wait. ``--quiet`` turns both off. Progress goes to
stderr only: stdout (tables, ``--json``) never holds progress noise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console

DELAY_S = 1.0
PREFIX = "placer: "
"""How a progress line starts (errors start ``error:``, warnings ``warning:``)."""


@contextmanager
def delayed_spinner(message: str, *, enabled: bool = True, delay_s: float = DELAY_S,
                    console: Console | None = None,
                    on_show: Callable[[], None] | None = None) -> Iterator[Callable[[str], None]]:
    """Yield a function that updates the message; progress shows after ``delay_s`` (at once,
    before the work starts, for ``delay_s <= 0``), and then calls ``on_show``."""
    console = console or Console(stderr=True)
    if not enabled:
        yield lambda _text: None
        return
    if not console.is_terminal:
        with _plain_lines(message, delay_s, console.file, on_show) as update:
            yield update
        return
    status = console.status(message)
    lock = threading.Lock()
    state = {"started": False, "done": False}

    def start() -> None:
        with lock:
            if not state["done"]:
                status.start()
                state["started"] = True
                if on_show is not None:
                    on_show()

    def update(text: str) -> None:
        status.update(text)

    timer = _after(delay_s, start)
    try:
        yield update
    finally:
        if timer is not None:
            timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                status.stop()


@contextmanager
def _plain_lines(message: str, delay_s: float, stream: TextIO,
                 on_show: Callable[[], None] | None = None) -> Iterator[Callable[[str], None]]:
    """One ``placer: <message> ...`` line once the work has run ``delay_s``; after that, one
    line per update. Updates before the delay only replace the message (quick steps are not
    worth a line)."""
    lock = threading.Lock()
    state = {"message": message, "late": False, "done": False}

    def write(text: str) -> None:
        stream.write(f"{PREFIX}{text} ...\n")
        stream.flush()

    def late() -> None:
        with lock:
            if not state["done"]:
                state["late"] = True
                write(str(state["message"]))
                if on_show is not None:
                    on_show()

    def update(text: str) -> None:
        with lock:
            state["message"] = text
            if state["late"] and not state["done"]:
                write(text)

    timer = _after(delay_s, late)
    try:
        yield update
    finally:
        if timer is not None:
            timer.cancel()
        with lock:
            state["done"] = True


def _after(delay_s: float, show: Callable[[], None]) -> threading.Timer | None:
    """``show`` after ``delay_s`` on a timer thread; now, and no timer, for ``delay_s <= 0``."""
    if delay_s <= 0:
        show()
        return None
    timer = threading.Timer(delay_s, show)
    timer.daemon = True
    timer.start()
    return timer
