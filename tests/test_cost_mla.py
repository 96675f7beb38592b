"""Multi-head latent attention (DeepSeek-V3, Kimi-K2): parameters against a hand count and the
published totals, GEMM shapes as megatron-core splits them over TP, core attention widths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.cost.compute import forward_flops_per_token, layer_work, tokens_per_gpu
from placer.cost.params import (
    StageShape,
    active_expert_params,
    attention_params,
    embedding_params,
    expert_params,
    num_moe_layers,
    stage_params,
    total_params,
)
from placer.errors import PlacerError
from placer.spec import Job, Layout, Model
from placer.spec.hf import model_from_hf_config
from placer.spec.presets import load_model, model_preset

HF = Path(__file__).parent / "data" / "hf"
DSV3 = load_model(str(HF / "deepseek-v3" / "config.json"))


def _activated(model: Model) -> int:
    """Parameters one token passes through: all but the routed experts it is not sent to."""
    return total_params(model) - num_moe_layers(model) * (
        expert_params(model) - active_expert_params(model))


def test_deepseek_v3_attention_params_match_the_hand_count() -> None:
    # modeling_deepseek_v3.py's weights: q_a_proj 7168x1536, q_a_layernorm 1536, q_b_proj
    # 1536x(128x192), kv_a_proj_with_mqa 7168x(512+64), kv_a_layernorm 512, kv_b_proj
    # 512x(128x(128+128)), o_proj (128x128)x7168, and the layer's two RMSNorms of 7168.
    hand = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
            + 128 * 128 * 7168 + 2 * 7168)
    assert hand == 187_121_664
    assert attention_params(DSV3) == hand


def test_deepseek_v3_totals_match_the_report() -> None:
    # DeepSeek-V3 technical report (arXiv:2412.19437, abstract and section 4.2): 671B total
    # parameters, 37B activated per token (the main model, without the 14B MTP module).
    assert total_params(DSV3) == pytest.approx(671e9, rel=0.005)  # 671.03B
    # The embedding lookup is no GEMM; the output layer is. 36.63B against the rounded 37B.
    activated = _activated(DSV3) - embedding_params(DSV3)
    assert activated == pytest.approx(37e9, rel=0.015)


def test_kimi_k2_totals_match_its_model_card() -> None:
    # moonshotai/Kimi-K2-Instruct README: "1 trillion total parameters", "32 billion activated".
    kimi = model_preset("kimi-k2")
    assert total_params(kimi) == pytest.approx(1e12, rel=0.03)  # 1.026T
    assert _activated(kimi) - embedding_params(kimi) == pytest.approx(32e9, rel=0.02)


def test_mla_gemms_split_over_tp_as_megatron_core_does() -> None:
    job = Job(seq_len=4096, global_batch_size=8)
    layout = Layout(tp=8, sequence_parallel=True)
    tokens = tokens_per_gpu(job, layout)
    work = layer_work(DSV3, job, layout, moe_layer=False)
    # Down projections whole on each rank over its 1/8 of the tokens; up projections
    # column-parallel over all tokens; the output projection row-parallel.
    assert work.gemm_shapes[:5] == (
        (tokens / 8, 1536, 7168), (tokens, 128 * 192 / 8, 1536),
        (tokens / 8, 576, 7168), (tokens, 128 * 256 / 8, 512), (tokens, 7168, 128 * 128 / 8))
    assert sum(2 * m * n * k for m, n, k in work.gemm_shapes[:5]) == pytest.approx(
        sum(f for f, _ in work.gemms[:5]))
    # Causal flash attention: Q K^T over 192 and P V over 128 per head, half the keys.
    assert work.attention_flops == pytest.approx(2 * tokens * 16 * (192 + 128) * 2048)


def test_model_flops_count_each_weight_twice_and_the_narrow_values() -> None:
    projections = 187_121_664 - 2 * 7168 - 2048  # the hand count above, less its norms
    attention = 2 * projections + 2 * 128 * (192 + 128) * 4096  # non-causal, Q K^T and P V
    dense = 2 * 3 * 7168 * 18432
    moe = 2 * 7168 * 256 + 2 * 8 * 3 * 7168 * 2048 + 2 * 3 * 7168 * 2048  # router, 8 + shared
    expected = 61 * attention + 3 * dense + 58 * moe + 2 * 129280 * 7168
    assert forward_flops_per_token(DSV3, 4096) == pytest.approx(expected, rel=1e-12)


def test_query_without_compression_is_one_projection() -> None:
    # DeepSeek-V2-Lite: q_lora_rank null, 16 heads, kv_lora_rank 512 (its config.json).
    data = json.loads((HF / "deepseek-v3" / "config.json").read_text())
    lite = model_from_hf_config({**data, "q_lora_rank": None, "hidden_size": 2048,
                                 "num_attention_heads": 16, "num_key_value_heads": 16},
                                default_name="lite", source="config.json")
    assert lite.mla is not None and lite.mla.q_lora_rank is None
    projections = 2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048
    assert attention_params(lite) == projections + 2 * 2048 + 512


@pytest.mark.parametrize(("update", "message"), [
    ({"num_kv_heads": 8}, "num_kv_heads 8 with mla"),
    ({"head_dim": 64}, "qk_rope_head_dim 64 is not below head_dim 64"),
])
def test_inconsistent_mla_is_a_clear_error(update: dict[str, int], message: str) -> None:
    with pytest.raises((ValueError, PlacerError), match=message):
        Model.model_validate({**DSV3.model_dump(), **update})


def test_down_projections_are_whole_on_every_tp_rank() -> None:
    shape = StageShape(stage=0, layers=1, moe_layers=0, first=False, last=False)
    down = 7168 * 1536 + 1536 + 7168 * 576 + 512  # q_a_proj, kv_a_proj_with_mqa, their norms
    dense = 187_121_664 + 3 * 7168 * 18432  # attention and a dense MLP
    for tp in (1, 8):
        params = stage_params(DSV3, Layout(tp=tp), shape)
        assert params.dense == pytest.approx(down + (dense - down) / tp)
