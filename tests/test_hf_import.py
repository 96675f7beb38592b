"""Hugging Face config.json import: each public config maps to the right placer Model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from placer.errors import PlacerError
from placer.spec.hf import is_hf_config, model_from_hf_config
from placer.spec.presets import load_model, model_preset

HF = Path(__file__).parent / "data" / "hf"

# What each public config says, read off the files in tests/data/hf (see the README there).
EXPECTED: dict[str, dict[str, Any]] = {
    "llama-3-8b": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, kv_heads=8,
                       attention_head_dim=128, ffn_hidden_size=14336, gated_mlp=True,
                       tied_embeddings=False, vocab_size=128256, max_seq_len=8192, moe=None),
    "qwen2-7b": dict(num_layers=28, hidden_size=3584, num_attention_heads=28, kv_heads=4,
                     attention_head_dim=128, ffn_hidden_size=18944, gated_mlp=True,
                     tied_embeddings=False, vocab_size=152064, max_seq_len=131072, moe=None),
    "gpt2": dict(num_layers=12, hidden_size=768, num_attention_heads=12, kv_heads=12,
                 attention_head_dim=64, ffn_hidden_size=3072, gated_mlp=False,
                 tied_embeddings=True, vocab_size=50257, max_seq_len=1024, moe=None),
    "gpt-neox-20b": dict(num_layers=44, hidden_size=6144, num_attention_heads=64, kv_heads=64,
                         attention_head_dim=96, ffn_hidden_size=24576, gated_mlp=False,
                         tied_embeddings=False, vocab_size=50432, max_seq_len=2048, moe=None),
    "mixtral-8x7b": dict(num_layers=32, hidden_size=4096, num_attention_heads=32, kv_heads=8,
                         attention_head_dim=128, ffn_hidden_size=14336, gated_mlp=True,
                         tied_embeddings=False, vocab_size=32000, max_seq_len=32768,
                         moe=dict(num_experts=8, top_k=2, expert_ffn_hidden_size=14336,
                                  num_shared_experts=0, first_dense_layers=0,
                                  layer_frequency=1)),
    "qwen3-30b-a3b": dict(num_layers=48, hidden_size=2048, num_attention_heads=32, kv_heads=4,
                          attention_head_dim=128, ffn_hidden_size=6144, gated_mlp=True,
                          tied_embeddings=False, vocab_size=151936, max_seq_len=40960,
                          moe=dict(num_experts=128, top_k=8, expert_ffn_hidden_size=768,
                                   num_shared_experts=0, first_dense_layers=0,
                                   layer_frequency=1)),
    "gpt-oss-120b": dict(num_layers=36, hidden_size=2880, num_attention_heads=64, kv_heads=8,
                         attention_head_dim=64, ffn_hidden_size=2880, gated_mlp=True,
                         tied_embeddings=False, vocab_size=201088, max_seq_len=131072,
                         sliding_window=128, num_sliding_window_layers=18,
                         moe=dict(num_experts=128, top_k=4, expert_ffn_hidden_size=2880,
                                  num_shared_experts=0, first_dense_layers=0,
                                  layer_frequency=1)),
    # MLA: 128 heads; query/key heads of qk_nope_head_dim + qk_rope_head_dim = 128 + 64.
    "deepseek-v3": dict(num_layers=61, hidden_size=7168, num_attention_heads=128, kv_heads=128,
                        attention_head_dim=192, ffn_hidden_size=18432, gated_mlp=True,
                        tied_embeddings=False, vocab_size=129280, max_seq_len=163840,
                        moe=dict(num_experts=256, top_k=8, expert_ffn_hidden_size=2048,
                                 num_shared_experts=1, shared_expert_ffn_hidden_size=2048,
                                 first_dense_layers=3, layer_frequency=1)),
}

# Whether each model's MLP / expert linears carry biases, read off transformers' modeling files
# (GPT-2 Conv1D and GPT-NeoX nn.Linear MLPs: biases; GptOssExperts gate_up_proj_bias and
# down_proj_bias; Llama, Qwen2 (QKV bias only), Mixtral, Qwen3-MoE and DeepSeek-V3 MLPs:
# bias=False) and Megatron-Bridge 0.3.1's bridges (gpt_oss add_bias_linear True; qwen2,
# qwen3_moe, deepseek_v3 False).
BIASED = {"gpt2", "gpt-neox-20b", "gpt-oss-120b"}


def _config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((HF / name / "config.json").read_text())
    return data


def _import(data: dict[str, Any]) -> Any:
    return model_from_hf_config(data, default_name="m", source="config.json")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_public_config_imports_to_the_right_model(name: str) -> None:
    model = load_model(str(HF / name / "config.json"))
    assert model.name == name  # the folder names the model, as the Hub lays files out
    expected = dict(EXPECTED[name])
    moe = expected.pop("moe")
    for field, value in expected.items():
        assert getattr(model, field) == value, field
    assert model.linear_bias is (name in BIASED)
    if moe is None:
        assert model.moe is None
    else:
        assert model.moe is not None
        for field, value in moe.items():
            assert getattr(model.moe, field) == value, f"moe.{field}"


@pytest.mark.parametrize(("hf_name", "preset", "differences"), [
    ("mixtral-8x7b", "mixtral-8x7b", {}),
    ("qwen3-30b-a3b", "qwen3-30b-a3b", {}),
    ("gpt-oss-120b", "gpt-oss-120b", {}),
    ("llama-3-8b", "llama3-8b", {"max_seq_len": 131072}),  # the preset is Llama 3.1 (128K)
    ("deepseek-v3", "deepseek-v3", {}),
])
def test_import_agrees_with_the_preset(hf_name: str, preset: str,
                                       differences: dict[str, Any]) -> None:
    imported = _import(_config(hf_name))
    reference = model_preset(preset)
    assert imported.model_copy(update={"name": preset, **differences}) == reference


@pytest.mark.parametrize(("name", "changes", "window", "layers"), [
    ("gpt-oss-120b", {}, 128, 18),  # layer_types alternates sliding and full attention
    ("llama-3-8b", {"sliding_window": 4096}, 4096, 32),  # no layer_types: every layer (Mistral)
    ("qwen2-7b", {}, None, 0),  # use_sliding_window: false turns the key off
    ("mixtral-8x7b", {}, None, 0),  # sliding_window: null
    ("gpt-oss-120b", {"layer_types": ["full_attention"] * 36}, None, 0),
])
def test_sliding_window_attention(name: str, changes: dict[str, Any], window: int | None,
                                  layers: int) -> None:
    model = _import({**_config(name), **changes})
    assert model.sliding_window == window
    assert model.num_sliding_window_layers == layers


def test_layer_types_of_the_wrong_length_is_a_clear_error() -> None:
    data = {**_config("gpt-oss-120b"), "layer_types": ["sliding_attention", "full_attention"]}
    with pytest.raises(PlacerError, match="'layer_types'.*36 strings"):
        _import(data)


def test_deepseek_latent_attention_keys() -> None:
    mla = _import(_config("deepseek-v3")).mla
    assert mla is not None
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim, mla.v_head_dim) == (
        1536, 512, 64, 128)
    assert _import(_config("llama-3-8b")).mla is None


def test_deepseek_dense_and_moe_layers() -> None:
    model = _import(_config("deepseek-v3"))
    assert [model.is_moe_layer(i) for i in range(5)] == [False, False, False, True, True]
    assert model.num_moe_layers == 58


@pytest.mark.parametrize(("changes", "first_dense", "frequency", "moe_layers"), [
    ({"decoder_sparse_step": 2}, 1, 2, 24),
    ({"mlp_only_layers": [0, 1]}, 2, 1, 46),
    ({"decoder_sparse_step": 3, "mlp_only_layers": [2]}, 5, 3, 15),
])
def test_qwen_moe_layer_rules(changes: dict[str, Any], first_dense: int, frequency: int,
                              moe_layers: int) -> None:
    data = {**_config("qwen3-30b-a3b"), **changes}
    model = _import(data)
    assert model.moe is not None
    assert (model.moe.first_dense_layers, model.moe.layer_frequency) == (first_dense, frequency)
    # Same MoE layers as transformers' rule: not in mlp_only_layers and (i + 1) % step == 0.
    step, dense = data.get("decoder_sparse_step", 1), set(data.get("mlp_only_layers", []))
    hf_rule = [i not in dense and (i + 1) % step == 0 for i in range(model.num_layers)]
    assert [model.is_moe_layer(i) for i in range(model.num_layers)] == hf_rule
    assert model.num_moe_layers == moe_layers


def test_deepseek_moe_layer_freq_follows_the_modeling_rule() -> None:
    data = {**_config("deepseek-v3"), "moe_layer_freq": 2}
    model = _import(data)
    hf_rule = [i >= 3 and i % 2 == 0 for i in range(61)]
    assert [model.is_moe_layer(i) for i in range(61)] == hf_rule


def test_moe_layers_placer_cannot_express_are_an_error() -> None:
    data = {**_config("qwen3-30b-a3b"), "mlp_only_layers": [5]}
    with pytest.raises(PlacerError, match="'mlp_only_layers'") as info:
        _import(data)
    assert "\n" not in str(info.value)


def test_qwen2_moe_shared_expert() -> None:
    data = {**_config("qwen3-30b-a3b"), "model_type": "qwen2_moe",
            "shared_expert_intermediate_size": 5632}
    moe = _import(data).moe
    assert moe is not None
    assert (moe.num_shared_experts, moe.shared_expert_ffn_hidden_size) == (1, 5632)


def test_gpt_oss_top_k_from_experts_per_token_alone() -> None:
    data = _config("gpt-oss-120b")
    del data["num_experts_per_tok"]
    moe = _import(data).moe
    assert moe is not None and moe.top_k == 4


def test_gpt2_style_inner_size_and_multi_query() -> None:
    data = {**_config("gpt2"), "n_inner": 2048}
    assert _import(data).ffn_hidden_size == 2048
    data = {**_config("gpt2"), "n_inner": None}
    assert _import(data).ffn_hidden_size == 4 * 768
    bigcode = {**_config("gpt2"), "model_type": "gpt_bigcode", "multi_query": True}
    model = _import(bigcode)
    assert (model.kv_heads, model.tied_embeddings, model.gated_mlp) == (1, True, False)


@pytest.mark.parametrize(("activation", "gated"), [("silu", True), ("gelu", False)])
def test_unknown_model_type_gates_by_activation(activation: str, gated: bool) -> None:
    data = {**_config("llama-3-8b"), "model_type": "someday", "hidden_act": activation}
    assert _import(data).gated_mlp is gated


@pytest.mark.parametrize(("name", "changes", "biased"), [
    ("llama-3-8b", {"mlp_bias": True}, True),  # LlamaMLP's bias=config.mlp_bias
    ("llama-3-8b", {"model_type": "someday"}, True),  # no key: Megatron's add_bias_linear default
    ("llama-3-8b", {"model_type": "someday", "mlp_bias": False}, False),
    ("gpt2", {"model_type": "opt", "enable_bias": False}, False),  # OPTConfig enable_bias
    ("gpt2", {"model_type": "falcon"}, False),  # FalconConfig bias defaults to False
    ("gpt-oss-120b", {"attention_bias": False}, True),  # the experts' biases have no key
    ("mixtral-8x7b", {"mlp_bias": True}, False),  # MixtralBlockSparseTop2MLP: bias=False
])
def test_linear_bias_keys(name: str, changes: dict[str, Any], biased: bool) -> None:
    assert _import({**_config(name), **changes}).linear_bias is biased


def test_linear_bias_that_is_not_a_flag_is_one_line_naming_the_key() -> None:
    with pytest.raises(PlacerError, match="'mlp_bias' is 'yes'; expected true or false"):
        _import({**_config("llama-3-8b"), "mlp_bias": "yes"})


def test_explicit_tie_word_embeddings_wins_over_the_family_default() -> None:
    assert _import({**_config("gpt2"), "tie_word_embeddings": False}).tied_embeddings is False
    assert _import({**_config("qwen2-7b"), "tie_word_embeddings": True}).tied_embeddings is True


def test_name_from_name_or_path_is_sanitised() -> None:
    data = {**_config("llama-3-8b"), "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
    assert _import(data).name == "Meta-Llama-3-8B"
    data["_name_or_path"] = "/home/me/my model (v2)/"
    assert _import(data).name == "my-model-v2"


@pytest.mark.parametrize(("model", "key"), [
    ("llama-3-8b", "num_hidden_layers"),
    ("llama-3-8b", "intermediate_size"),
    ("llama-3-8b", "vocab_size"),
    ("gpt2", "n_embd"),
    ("gpt-neox-20b", "num_attention_heads"),
    ("mixtral-8x7b", "num_experts_per_tok"),
    ("qwen3-30b-a3b", "moe_intermediate_size"),
    ("deepseek-v3", "moe_intermediate_size"),
])
def test_missing_key_is_one_line_naming_it(model: str, key: str) -> None:
    data = _config(model)
    del data[key]
    with pytest.raises(PlacerError) as info:
        _import(data)
    message = str(info.value)
    assert f"'{key}'" in message and "missing" in message and "\n" not in message


@pytest.mark.parametrize(("key", "value"), [
    ("hidden_size", "4096"), ("num_hidden_layers", 0), ("vocab_size", 1.5),
    ("num_attention_heads", True), ("tie_word_embeddings", "no"),
])
def test_bad_value_is_one_line_naming_the_key(key: str, value: Any) -> None:
    data = {**_config("llama-3-8b"), key: value}
    with pytest.raises(PlacerError, match=f"'{key}'") as info:
        _import(data)
    assert "\n" not in str(info.value)


def test_inconsistent_heads_fail_in_the_model_validator() -> None:
    data = {**_config("llama-3-8b"), "num_key_value_heads": 7}
    with pytest.raises(PlacerError, match="num_kv_heads"):
        _import(data)


def test_nested_text_config_gets_a_hint() -> None:
    data = {"model_type": "llava", "text_config": _config("llama-3-8b")}
    with pytest.raises(PlacerError, match="text_config"):
        _import(data)


def test_detection() -> None:
    assert all(is_hf_config(_config(name)) for name in EXPECTED)
    assert not is_hf_config({"name": "x", "num_layers": 2, "hidden_size": 8})


def test_a_json_file_not_named_config_json_is_named_after_itself(tmp_path: Path) -> None:
    path = tmp_path / "my-llama.json"
    path.write_text(json.dumps(_config("llama-3-8b")))
    assert load_model(str(path)).name == "my-llama"
