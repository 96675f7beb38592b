"""A spinner on stderr that appears only when work takes longer than a second.

Quick runs stay silent, and nothing is drawn unless stderr is a terminal, so piped and captured
output never contains progress noise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console

DELAY_S = 1.0


@contextmanager
def delayed_spinner(message: str, *, enabled: bool = True, delay_s: float = DELAY_S,
                    console: Console | None = None) -> Iterator[Callable[[str], None]]:
    """Yield a function that updates the message; the spinner shows after ``delay_s``."""
    console = console or Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda _text: None
        return
    status = console.status(message)
    lock = threading.Lock()
    state = {"started": False, "done": False}

    def start() -> None:
        with lock:
            if not state["done"]:
                status.start()
                state["started"] = True

    def update(text: str) -> None:
        status.update(text)

    timer = threading.Timer(delay_s, start)
    timer.daemon = True
    timer.start()
    try:
        yield update
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                status.stop()
