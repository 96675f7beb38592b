"""bench/accuracy.py reads full-iteration CUDA graphs and the CuTeDSL grouped MLP where the
Megatron-Bridge release's performance config sets them (BRIDGE_FULL_ITERATION_GRAPHS).

The truth is the framework's own config (cited at bench/accuracy.py): from v0.5.0 (the 26.06
container) on, Qwen3-235B-A22B's 256-GPU GB200 FP8-MX V2 config (PP 8, VPP 3, EP 32) sets
cuda_graph_impl="full_iteration" and cutedsl_fused_grouped_mlp=True (Megatron-Bridge@55443cb);
its 64-GPU V1 config and the releases before keep TE-scoped graphs.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import accuracy  # noqa: E402

RECORDS = json.loads((REPO / "bench" / "data" / "published-runs.json").read_text())["records"]


def _qwen235_gb200_mx() -> list[dict]:
    return [r for r in RECORDS if r["source_id"] in accuracy.MEGATRON_BRIDGE_SOURCES
            and "qwen3235ba22b" in accuracy._slug(r["model"]["name"])
            and r["hardware"]["gpu_type"].lower().startswith("gb200")
            and "mx" in r["precision"].lower().split()[0]]


def _release(record: dict) -> tuple[int, int]:
    words = record["source_locator"].split()[0].split(".")
    return int(words[0]), int(words[1])


def test_qwen3_235b_gb200_mxfp8_v2_graphs_from_26_06() -> None:
    rows = _qwen235_gb200_mx()
    late = [r for r in rows if _release(r) >= (26, 6)]
    early = [r for r in rows if _release(r) < (26, 6)]
    assert len(late) == 3 and len(early) >= 4
    assert all(accuracy.bridge_graphs(r) == (True, True) for r in late)
    assert not any(accuracy.bridge_graphs(r)[0] for r in early)
    options = accuracy.options_for(late[0])
    assert options.cuda_graphs and options.moe_grouped_kernel == "single"


def test_the_64_gpu_v1_layout_keeps_te_scoped_graphs() -> None:
    """The same model, GPU and release at the V1 layout (PP 8, EP 8, no VPP) is not graphed."""
    record = copy.deepcopy(next(r for r in _qwen235_gb200_mx() if _release(r) >= (26, 6)))
    record["layout"].update({"ep": 8, "vpp": None, "dp": 8})
    assert accuracy.bridge_graphs(record) == (False, False)


def test_the_other_full_iteration_rules_are_unchanged() -> None:
    """Qwen3-30B-A3B and GPT-OSS-120B GB200 FP8-MX rows of 26.06+ still read their rules."""
    for slug, cutedsl in (("qwen330ba3b", True), ("gptoss120b", True)):
        rows = [r for r in RECORDS if r["source_id"] in accuracy.MEGATRON_BRIDGE_SOURCES
                and slug in accuracy._slug(r["model"]["name"])
                and r["hardware"]["gpu_type"].lower().startswith("gb200")
                and "mx" in r["precision"].lower().split()[0] and _release(r) >= (26, 6)]
        assert rows and all(accuracy.bridge_graphs(r) == (True, cutedsl) for r in rows)


def test_gpt_oss_gb200_mxfp8_full_iteration_config_fuses_the_mlp_and_recomputes_nothing() -> None:
    """Megatron-Bridge v0.5.0 GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 (and v0.6.0's
    gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config): full-iteration graphs, the CuTeDSL fused
    grouped MLP, recompute_modules=[]; its BF16 rows keep the layernorm + moe_act recompute."""
    rows = [r for r in RECORDS if r["source_id"] in accuracy.MEGATRON_BRIDGE_SOURCES
            and "gptoss120b" in accuracy._slug(r["model"]["name"])
            and r["hardware"]["gpu_type"].lower().startswith("gb200")]
    mx = [r for r in rows if "mx" in r["precision"].lower().split()[0] and _release(r) >= (26, 6)
          and not r["result"].get("other", {}).get("known_regression")]
    bf16 = [r for r in rows if r["precision"].lower().startswith("bf16")]
    assert mx and bf16
    for record in mx:
        assert accuracy.bridge_graphs(record) == (True, True)
        case = accuracy.case_for(record)
        assert case.layout.recompute == "none" and case.options.moe_grouped_kernel == "single"
    for record in bf16:
        case = accuracy.case_for(record)
        assert case.layout.recompute == "selective"
        assert case.layout.recompute_modules == ("layernorm", "moe_act")


def _deepseek_bridge_rows() -> list[dict]:
    return [r for r in RECORDS if r["source_id"] in accuracy.MEGATRON_BRIDGE_SOURCES
            and "deepseekv3" in accuracy._slug(r["model"]["name"])]


def test_deepseek_v3_gb200_mxfp8_graphs_from_26_06() -> None:
    """v0.5.0/v0.5.1 DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V1 and v0.6.0's
    deepseek_v3_pretrain_256gpu_gb200_fp8mx_config: full-iteration graphs and the CuTeDSL
    grouped MLP; v0.4.x aliases GB200_V1 (TE-scoped graphs); B200 never graphs the iteration."""
    gb200 = [r for r in _deepseek_bridge_rows()
             if r["hardware"]["gpu_type"].lower().startswith("gb200")
             and "mx" in r["precision"].lower().split()[0]]
    late = [r for r in gb200 if _release(r) >= (26, 6)]
    assert len(late) == 3
    assert all(accuracy.bridge_graphs(r) == (True, True) for r in late)
    assert not any(accuracy.bridge_graphs(r)[0] for r in gb200 if _release(r) < (26, 6))
    b200 = [r for r in _deepseek_bridge_rows()
            if r["hardware"]["gpu_type"].lower().startswith("b200")]
    assert b200 and not any(accuracy.bridge_graphs(r)[0] for r in b200)


def test_deepseek_v3_recomputes_mla_up_proj_except_gb200_fp8_of_26_04() -> None:
    """Every release's B200/GB200 DeepSeek-V3 config recomputes mla_up_proj, except GB200_V1 of
    v0.4.x (26.04, aliased by GB200_FP8_MX_V1), which recomputes mlp."""
    rows = _deepseek_bridge_rows()
    assert len(rows) >= 10
    for record in rows:
        case = accuracy.case_for(record)
        gb200_2604 = (record["hardware"]["gpu_type"].lower().startswith("gb200")
                      and _release(record) == (26, 4))
        assert case.layout.recompute == "selective"
        assert case.layout.recompute_modules == (("mlp",) if gb200_2604 else ("mla_up_proj",))
