"""The console entry point freezes the heap before the process exits (placer.cli._exit_frozen),
and only there: run in process (tests pass argv), the collector keeps working."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from placer.cli import main


def test_the_process_entry_point_freezes_the_heap_before_exit() -> None:
    # An atexit handler runs after main() returns: it sees what the interpreter's final
    # collection would walk (nothing outside the permanent generation but what exit adds).
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
            "from placer.cli import main\n"
            "sys.argv = ['placer', 'presets']\n"
            "main()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    frozen = int(out.strip().splitlines()[-1].split()[1])
    assert frozen > 10_000  # every object alive at the end (~36,000 for `placer presets`)


def test_in_process_runs_leave_the_collector_alone(capsys: pytest.CaptureFixture[str]) -> None:
    before = gc.get_freeze_count()
    with pytest.raises(SystemExit) as exc:
        main(["presets"])
    assert exc.value.code == 0
    assert "llama3-70b" in capsys.readouterr().out
    assert gc.get_freeze_count() == before
