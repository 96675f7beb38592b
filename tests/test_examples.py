"""Every example in examples/ reruns to exactly its stored output (determinism) and is complete.

When the cost model or solver changes on purpose, rerun ``.venv/bin/python examples/regenerate.py``
and update each README whose answer moved (the README test below names them).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest

from placer.cli import main
from placer.report.plan import plan_json
from placer.report.tables import render_text
from placer.spec import Plan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXPECTED = {
    "llama3-70b-8x-dgx-h100", "gpt3-175b-128x-dgx-a100", "mixtral-8x22b-16x-dgx-h100",
    "llama3-405b-128k-2048x-h100", "failed-gpus-64x-dgx-h100", "mixed-a100-h100",
    "l40s-pcie-box",
}
SLOW = {"mixtral-8x22b-16x-dgx-h100", "failed-gpus-64x-dgx-h100"}
"""Examples whose four searches take 10-20 s of CPU (MoE degree space; CP-SAT placement on a
cluster with failed GPUs). They run in the separate, clearly named slow test below."""
STALE = ("stored output differs: if the cost model or solver changed on purpose, run "
         "'.venv/bin/python examples/regenerate.py' and update the README")


def load_regenerate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regenerate", EXAMPLES / "regenerate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REGENERATE = load_regenerate()
NAMES = [p.name for p in REGENERATE.example_dirs()]


def check_reproduces(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    example = EXAMPLES / name
    rec = REGENERATE.run_example(example)
    assert plan_json(rec.plan) == (example / "plan.json").read_text(encoding="utf-8"), STALE
    assert render_text(rec) == (example / "output.txt").read_text(encoding="utf-8"), STALE


def test_the_examples_the_issue_asks_for_are_all_there() -> None:
    assert set(NAMES) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED - SLOW))
def test_example_reproduces_its_stored_outputs(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check_reproduces(name, monkeypatch)


@pytest.mark.parametrize("name", sorted(SLOW))
def test_slow_example_reproduces_its_stored_outputs(name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Slow (10-20 s each): see ``SLOW``."""
    check_reproduces(name, monkeypatch)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_is_complete_and_its_readme_states_the_stored_answer(name: str) -> None:
    example = EXAMPLES / name
    for file in ("command.txt", "output.txt", "plan.json", "README.md", "plots/rankmap.png",
                 "plots/breakdown.png"):
        assert (example / file).is_file(), f"{name}/{file} is missing"
    for ref in re.findall(r"examples/\S+\.(?:yaml|json)", (example / "command.txt").read_text()):
        assert (ROOT / ref).is_file(), f"{name}/command.txt names {ref}, which does not exist"
    plan = Plan.model_validate_json((example / "plan.json").read_text())
    readme = (example / "README.md").read_text()
    best = plan.candidates[0].layout.compact()
    assert f"`{best}`" in readme, f"{name}/README.md must quote the stored answer `{best}`"
    assert (example / "command.txt").read_text().strip() in readme


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_plans_validate_against_the_schema(name: str) -> None:
    data = json.loads((EXAMPLES / name / "plan.json").read_text())
    jsonschema.validate(data, Plan.model_json_schema())


def test_the_first_example_through_the_installed_command(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    example = EXAMPLES / "l40s-pcie-box"
    argv = ["recommend-layout", *REGENERATE.command_argv(example)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == (example / "output.txt").read_text(), STALE
