"""Running the CLI in process, and the shape every user error must have."""

from __future__ import annotations

import pytest

from placer.cli import main


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``placer ARGS`` in process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


def assert_one_line_error(code: int, err: str) -> None:
    """Exit code 2 and one ``error: ...`` line, no traceback."""
    assert code == 2, err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > 8, err
    assert "Traceback" not in err
