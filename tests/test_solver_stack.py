"""recommend-layout with a stack proposes only what that stack runs."""

from __future__ import annotations

import json

import pytest
from helpers_cli import cli

from placer.spec.layout import Layout
from placer.spec.presets import model_preset
from placer.spec.stack import load_stack, stack_problem


@pytest.mark.parametrize("stack", ["deepspeed", "torchtitan"])
def test_recommend_proposes_only_what_the_stack_runs(stack: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100",
                          "--nodes", "2", "--stack", stack, "--no-what-if", "--json"], capsys)
    assert code == 0, err
    layouts = [Layout.model_validate(c["layout"]) for c in json.loads(out)["candidates"]]
    assert layouts
    for layout in layouts:
        assert stack_problem(layout, load_stack(stack), model_preset("llama3-8b")) is None, (
            layout.compact())
    if stack == "deepspeed":  # its pipeline engine refuses ZeRO-2/3; no CP, no virtual stages
        assert all(lay.cp == 1 and lay.vpp == 1 and not (lay.pp > 1 and lay.zero_stage >= 2)
                   for lay in layouts)
    else:  # FSDP2 or replication, op-level selective checkpointing
        assert all(lay.zero_stage in (0, 3) and lay.recompute != "selective" for lay in layouts)
