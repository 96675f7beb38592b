"""Progress shows only for slow work: a spinner on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io
import time

from rich.console import Console

from placer.report.progress import delayed_spinner


def terminal() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=True, width=80), buffer


def test_slow_work_shows_the_spinner_and_its_updates() -> None:
    console, buffer = terminal()
    with delayed_spinner("searching layouts", delay_s=0.05, console=console) as update:
        time.sleep(0.3)
        update("checking what would change the answer")
        time.sleep(0.3)
    text = buffer.getvalue()
    assert "searching layouts" in text and "checking what would change the answer" in text


def test_quick_work_shows_nothing() -> None:
    console, buffer = terminal()
    with delayed_spinner("searching layouts", delay_s=5.0, console=console) as update:
        update("still quick")
    assert buffer.getvalue() == ""


def test_nothing_when_disabled() -> None:
    console, buffer = terminal()
    with delayed_spinner("x", enabled=False, delay_s=0.0, console=console):
        time.sleep(0.1)
    plain = io.StringIO()
    with delayed_spinner("x", enabled=False, delay_s=0.0, console=Console(file=plain)):
        time.sleep(0.1)
    assert buffer.getvalue() == "" and plain.getvalue() == ""


def test_plain_lines_when_not_a_terminal() -> None:
    plain = io.StringIO()
    with delayed_spinner("searching layouts", delay_s=0.05, console=Console(file=plain)) as up:
        up("still before the delay")
        time.sleep(0.3)
        up("checking what would change the answer")
    assert plain.getvalue() == ("placer: still before the delay ...\n"
                                "placer: checking what would change the answer ...\n")
    quick = io.StringIO()
    with delayed_spinner("searching layouts", delay_s=5.0, console=Console(file=quick)):
        pass
    assert quick.getvalue() == ""
