"""Running the CLI in process, and the shape every user error must have."""

from __future__ import annotations

import pytest

from placer.cli import main
from placer.report.progress import PREFIX as PROGRESS


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``placer ARGS`` in process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def assert_one_line_error(code: int, err: str) -> None:
    """Exit code 2 and one ``error: ...`` line, no traceback (progress lines, ``placer: ...``,
    which a search over a second prints first, and ``warning: ...`` lines about the inputs, such
    as a GPU's borrowed constants, are not part of the error)."""
    assert code == 2, err
    lines = [line for line in err.strip("\n").split("\n")
             if not line.startswith((PROGRESS, "warning: "))]
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > 8, err
    assert "Traceback" not in err
