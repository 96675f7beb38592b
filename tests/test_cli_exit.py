"""The console entry point freezes the heap before the process exits (placer.cli._exit_frozen)
and recommend-layout turns the cyclic collector off (placer.cli.collector_off), only there: run
in process (tests pass argv), the collector keeps working."""

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


SMALL = ["recommend-layout", "--model", "llama3-8b", "--cluster", "pcie-8x-l40s", "--seq-len",
         "4096", "--no-what-if", "--quiet"]


def _collector_at_exit(args: list[str]) -> bool:
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('enabled', gc.isenabled()))\n"
            "from placer.cli import main\n"
            f"sys.argv = ['placer', *{args!r}]\n"
            "main()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1] == "enabled True"


def test_recommend_layout_as_a_process_runs_without_the_cyclic_collector() -> None:
    assert not _collector_at_exit(SMALL)
    assert _collector_at_exit(["presets"])  # other commands keep it


def test_in_process_runs_leave_the_collector_alone(capsys: pytest.CaptureFixture[str]) -> None:
    before = gc.get_freeze_count()
    for args in (["presets"], SMALL):
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 0
        assert gc.get_freeze_count() == before and gc.isenabled()
    assert "llama3-8b" in capsys.readouterr().out
