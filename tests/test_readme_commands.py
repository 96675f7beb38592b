"""Every command of the README's tour runs as written, in order, in a fresh folder.

The tour is read from README.md itself (the ``bash`` block under "A short tour"), so a changed
line is tested as it reads. Each runs under bash from a folder holding only links to the
checkout's ``examples`` and ``tests`` (the sample files the tour names), with the venv's
``placer`` first on PATH, as after ``. .venv/bin/activate``. The emulated-cluster commands need
root, ``ip`` and ``tc``; without them they are skipped, each with its reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMULATED = ("--emulate",)


def tour_commands() -> list[str]:
    """The tour's commands: continuation lines joined, trailing ``# comments`` dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## A short tour\n.*?```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no tour block"
    joined = block.group(1).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if command:
            commands.append(" ".join(command.split()))
    return commands


COMMANDS = tour_commands()


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tour")
    for name in ("examples", "tests"):
        (folder / name).symlink_to(ROOT / name)
    return folder


def _emulation_missing() -> str:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"needs {' and '.join(missing)} (iproute2)" if missing else ""


def test_the_tour_has_the_commands_a_newcomer_needs() -> None:
    firsts = [c.split()[1] for c in COMMANDS]
    assert all(c.startswith("placer ") for c in COMMANDS)
    for command in ("presets", "init", "recommend-layout", "estimate", "launch", "check",
                    "topology", "calibrate", "verify", "schema"):
        assert command in firsts, command


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_readme_installs_what_the_tour_needs() -> None:
    """The first install line (``pip install -e .``) brings what the tour's plain commands import
    (--plot draws with matplotlib); calibrate and verify need torch, the ``verify`` extra the
    README's test setup installs, and the README says so above the tour."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert any("--plot" in c for c in COMMANDS)
    assert "matplotlib" in _requirement_names(project["dependencies"])
    assert "torch" not in _requirement_names(project["dependencies"])
    assert "torch" in _requirement_names(project["optional-dependencies"]["verify"])
    assert re.search(r"pip install -q -e '\.\[dev,verify\]' torch==", text)
    tour_intro = text.split("## A short tour", 1)[1].split("```bash", 1)[0]
    assert "`calibrate` and `verify` also need torch" in tour_intro


def test_the_tours_check_names_the_model_of_the_plan_it_checks() -> None:
    """``placer check`` on the launch files gets the model the tour's plan was made for, so it
    checks memory and divisibility instead of warning that the model is unknown."""
    def flag(command: str, name: str) -> str:
        words = command.split()
        return words[words.index(name) + 1] if name in words else ""

    plan = next(c for c in COMMANDS if "> plan.json" in c)
    launch = next(c for c in COMMANDS if c.startswith("placer launch plan.json"))
    check = next(c for c in COMMANDS if c.startswith("placer check "))
    assert check.split()[2].startswith(flag(launch, "--out"))
    assert flag(check, "--model") == flag(plan, "--model") != ""
    assert flag(check, "--cluster") == flag(plan, "--cluster")


@pytest.mark.parametrize("command", [
    pytest.param(c, marks=pytest.mark.serial) if any(f in c.split() for f in EMULATED) else c
    for c in COMMANDS])  # serial: calibrate times the emulated links (tests/conftest.py)
def test_readme_command_runs_as_written(command: str, tour_dir: Path) -> None:
    if any(flag in command.split() for flag in EMULATED):
        reason = _emulation_missing()
        if reason:
            pytest.skip(f"{command.split()[1]}: {reason}")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=tour_dir, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    if command.startswith("placer check "):  # a clean config: no finding, not even a warning
        assert "0 error(s), 0 warning(s)" in done.stdout, done.stdout
