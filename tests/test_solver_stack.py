"""recommend-layout with a stack proposes only what that stack runs."""

from __future__ import annotations

import json

import pytest
from helpers_cli import assert_one_line_error, cli

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


def _on_32(model: str, *constraints: str) -> list[str]:
    return ["recommend-layout", "--model", model, "--cluster", "dgx-h100", "--nodes", "4",
            "--no-what-if", "--json", *(a for c in constraints for a in ("--constraint", c))]


def test_recommend_keeps_expert_tp_off_for_biased_moe_on_megatron(
        capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-OSS's linears carry biases, which megatron-core runs only at ETP 1 (the stack rule
    moe-bias-needs-etp-1; tests/test_launch_accept_megatron.py has megatron-core's own assert
    as the truth): no candidate has expert TP, and asking for it is refused naming the rule,
    while Mixtral (no biases) gets ETP 2 under the same constraints."""
    code, out, err = cli(_on_32("gpt-oss-120b"), capsys)
    assert code == 0, err
    layouts = [Layout.model_validate(c["layout"]) for c in json.loads(out)["candidates"]]
    assert layouts and all(lay.etp == 1 for lay in layouts)
    code, out, err = cli(_on_32("gpt-oss-120b", "etp=2", "tp=2"), capsys)
    assert_one_line_error(code, err)
    assert "stack rule moe-bias-needs-etp-1" in err and "Bias in Moe" in err
    code, out, err = cli(_on_32("mixtral-8x7b", "etp=2", "tp=2"), capsys)
    assert code == 0, err
    assert {c["layout"]["etp"] for c in json.loads(out)["candidates"]} == {2}
