"""megatron-core builds DeepSeek-V3's latent attention from placer's Megatron and Bridge files.

Every candidate of the DeepSeek-V3 plan (helpers_mla) goes through tests/frameworks/
megatron_accept.py: its flags, parsed with Megatron-LM core_v0.16.1's names and defaults, select
``MLATransformerConfig`` as arguments.py's ``core_transformer_config_from_args`` does (L1311)
and megatron-core 0.16.1's ``__post_init__`` checks run on them; the Bridge overrides' model
section likewise (field names checked against Bridge 0.3.1's MLAModelProvider, and Bridge's own
YAML merge and setup run on them: bridge_applies). The config's shapes must be DeepSeek-V3's
config.json figures, by hand: 1536, 512, 128, 64, 128.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers_frameworks import Case, megatron_bridge_src, need, run_worker
from helpers_mla import mla_plan
from test_launch_accept_megatron import bridge_applies

from placer.launch import launch_bundle

pytestmark = pytest.mark.slow

DEEPSEEK_V3 = {"multi_latent_attention": True, "qk_layernorm": True, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
               "v_head_dim": 128}


def test_megatron_core_builds_deepseek_v3_latent_attention(tmp_path: Path) -> None:
    version = need("megatron-core")
    plan = mla_plan()
    m = plan.model
    assert m.moe is not None
    model = {"num_layers": m.num_layers, "hidden_size": m.hidden_size,
             "num_attention_heads": m.num_attention_heads,
             "ffn_hidden_size": m.ffn_hidden_size, "head_dim": m.head_dim,
             "num_kv_heads": m.num_attention_heads, "gated_mlp": m.gated_mlp,
             "expert_ffn_hidden_size": m.moe.expert_ffn_hidden_size,
             "num_experts": m.moe.num_experts, "top_k": m.moe.top_k,
             "add_bias_linear": m.linear_bias}  # DeepSeek-V3's preset: none
    manifest, cases = [], []
    for index, candidate in enumerate(plan.candidates):
        folder = tmp_path / f"c{index}"
        folder.mkdir()
        files, refused = launch_bundle(plan, index)
        # torchtitan may refuse a candidate (no expert TP in 0.3); the Megatron files may not
        megatron_refused = [r for r in refused if r.target.name.startswith("megatron")]
        assert not megatron_refused, [r.line() for r in megatron_refused]
        for f in files:
            (folder / f.name).write_text(f.text)
        manifest.append({"id": str(index), "dir": str(folder), "model": model,
                         "world_size": candidate.layout.num_gpus})
        cases.append(Case(str(index), plan, index, folder, tuple(f.name for f in files), ()))
    bridge_src = megatron_bridge_src()
    if bridge_src is None and os.environ.get("CI") == "true":
        pytest.fail("Megatron-Bridge source missing under CI=true")
    results = run_worker("megatron_accept.py", [], manifest, tmp_path,
                         env={"PLACER_MEGATRON_BRIDGE_SRC": str(bridge_src)} if bridge_src
                         else None)
    assert len(results) == len(plan.candidates)
    for case_id, got in results.items():
        assert "error" not in got, f"{case_id}: {got['error']}"
        assert got["config_class"] == "MLATransformerConfig", case_id
        assert got["mla"] == DEEPSEEK_V3, case_id
        bridge = got["bridge"]
        assert "error" not in bridge, f"{case_id}: Bridge overrides: {bridge['error']}"
        assert bridge["mla"] == DEEPSEEK_V3, case_id
        if bridge_src:
            assert bridge["unknown"] == {}, f"{case_id}: not Bridge fields {bridge['unknown']}"
    print(f"megatron-core {version}: {len(results)} DeepSeek-V3 candidates build "
          "MLATransformerConfig with DeepSeek-V3's shapes")
    # Bridge's own merge and setup keep them on an MLAModelProvider (q_lora_rank included).
    bridge_applies(cases, tmp_path)
