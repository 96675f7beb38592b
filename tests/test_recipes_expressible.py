"""Production recipes are accepted by ``placer estimate`` with the flags their framework uses,
and a stack refuses what its framework refuses, naming the rule.

Recipes: Llama-3.1-405B TP8 PP8 CP2 VPP8 (NeMo's 1,024-H100 recipe, 126 layers with the
embedding and loss counted: --account-for-embedding/loss-in-pipeline-split), Qwen3-235B-A22B
TP2 PP8 EP32 VPP4 and DeepSeek-V3 TP2 PP8 EP64 VPP4 (Megatron-Bridge H100 recipes; DeepSeek's
61 layers need --pipeline-model-parallel-layout), Kimi-K2 PP8 VPP4 EP32 with FSDP (FSDP2 inside
a pipeline, torchtitan), NVIDIA's single-node Llama-3-8B FP8 script
(NVIDIA/Megatron-LM@d98e8a6 examples/llama/train_llama3_8b_h100_fp8.sh: TP1 DP8, mbs 1, gbs 128,
seq 8192, distributed optimizer, --grad-reduce-in-bf16 --fp8-param-gather), and every layout of
the calibration data (bench/data/published-runs.json).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

ROOT = Path(__file__).resolve().parent.parent

RECIPES = [
    ("llama3-405b", "128", "8192", "512", "bf16", "megatron-core",
     "tp=8,pp=8,cp=2,vpp=8,emb=on,loss=on,sp=on,zero=1,recompute=full"),
    ("qwen3-235b-a22b", "32", "4096", "2048", "fp8", "megatron-core",
     "tp=2,pp=8,ep=32,vpp=4,emb=on,loss=on,sp=on,zero=1,recompute=selective,"
     "rmodules=moe_act+layernorm"),
    ("deepseek-v3", "128", "4096", "8192", "bf16", "megatron-core",
     "tp=2,pp=8,ep=64,vpp=4,pplayout=Et|(tt|)*30,L,sp=on,zero=1,recompute=selective,"
     "rmodules=mla_up_proj+moe_act+layernorm"),
    ("kimi-k2", "64", "4096", "4096", "bf16", "torchtitan",
     "pp=8,vpp=4,ep=32,zero=3,recompute=full"),
]


@pytest.mark.parametrize(("model", "nodes", "seq", "batch", "precision", "stack", "layout"),
                         RECIPES, ids=[r[0] for r in RECIPES])
def test_estimate_accepts_the_named_recipes(model: str, nodes: str, seq: str, batch: str,
                                            precision: str, stack: str, layout: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["estimate", "--model", model, "--cluster", "dgx-h100", "--nodes",
                          nodes, "--seq-len", seq, "--global-batch", batch, "--precision",
                          precision, "--stack", stack, "--layout", layout, "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["step_time_s"] > 0 and result["layout"]["pp"] == 8
    assert result["layout"]["vpp"] == (8 if model == "llama3-405b" else 4)


def test_llama3_8b_fp8_script_flags_reach_the_memory_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--grad-reduce-in-bf16 halves the main gradients, --fp8-param-gather the weights."""
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--seq-len", "8192", "--global-batch", "128", "--precision", "fp8", "--layout",
            "tp=1,dp=8,mbs=1,zero=1", "--json"]
    code, out, err = cli(base, capsys)
    assert code == 0, err
    plain = json.loads(out)["memory"]
    job = ROOT / "tests" / "data" / "llama3_8b_fp8_job.yaml"
    code, out, err = cli([*base, "--job", str(job)], capsys)
    assert code == 0, err
    flags = json.loads(out)["memory"]
    params = 8.03e9  # Llama-3-8B
    assert plain["gradients_bytes"] - flags["gradients_bytes"] == pytest.approx(2 * params,
                                                                                 rel=0.01)
    assert plain["weights_bytes"] - flags["weights_bytes"] == pytest.approx(params, rel=0.01)


@pytest.mark.parametrize(("stack", "layout", "rule"), [
    ("deepspeed", "pp=4,dp=2,zero=2", "pipeline-engine-refuses-zero-2-3"),
    ("megatron-core", "pp=2,dp=4,offload=2", "cpu-offloading-without-pp"),
])
def test_estimate_refuses_what_the_stack_refuses(stack: str, layout: str, rule: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes",
                        "1", "--stack", stack, "--layout", layout], capsys)
    assert_one_line_error(code, err)
    assert f"stack rule {rule}" in err


def test_every_calibration_layout_is_expressible() -> None:
    """bench/accuracy.py skips a record only for missing facts, never for its layout."""
    spec = importlib.util.spec_from_file_location("bench_accuracy",
                                                  ROOT / "bench" / "accuracy.py")
    assert spec is not None and spec.loader is not None
    accuracy = importlib.util.module_from_spec(spec)
    sys.modules["bench_accuracy"] = accuracy  # its dataclasses look their module up
    spec.loader.exec_module(accuracy)
    cases, skipped, _ = accuracy.load()
    assert cases
    refused = [(rid, why) for rid, why in skipped if "layout not valid" in why]
    assert refused == []
