"""Import a Hugging Face ``config.json`` into a placer ``Model`` (a local file; no network).

The keys read are those of the ``transformers`` configuration classes:

- Llama, Mistral, Qwen2, Qwen3 and most decoders: ``num_hidden_layers``, ``hidden_size``,
  ``num_attention_heads``, ``num_key_value_heads`` (absent: multi-head attention),
  ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``, ``max_position_embeddings``,
  ``head_dim`` (kept only when it differs from hidden_size / heads).
- GPT-2 style (gpt2, gptj, codegen, gpt_bigcode): ``n_layer``, ``n_embd``, ``n_head``, ``n_inner``
  (absent or null: 4 * n_embd), ``n_positions``; gpt2 ties its embeddings.
- GPT-NeoX: the standard names; its MLP is not gated.
- Mixture of experts, recognised by the key that holds the expert count:
  ``num_local_experts`` (Mixtral, GPT-OSS; top-k from ``num_experts_per_tok`` or
  ``experts_per_token``; experts as wide as ``intermediate_size``; every layer is MoE);
  ``num_experts`` (Qwen2-MoE, Qwen3-MoE; ``moe_intermediate_size``, ``decoder_sparse_step``,
  ``mlp_only_layers``, Qwen2-MoE's ``shared_expert_intermediate_size``);
  ``n_routed_experts`` (DeepSeek-V2/V3; ``moe_intermediate_size``, ``n_shared_experts``,
  ``first_k_dense_replace``, ``moe_layer_freq``).
  Each family's rule for which layers are MoE (from its modeling file) is applied and must reduce
  to placer's pattern: ``first_dense_layers`` dense layers, then every ``layer_frequency``-th.

Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2: ``kv_lora_rank`` present): ``mla`` takes
``q_lora_rank`` (null: no query compression, DeepSeek-V2-Lite), ``kv_lora_rank``,
``qk_rope_head_dim`` and ``v_head_dim``; ``head_dim`` is the query/key head width
``qk_nope_head_dim + qk_rope_head_dim`` (192 for DeepSeek-V3). The low-rank projections, their
latent norms and the narrower value heads are modelled (parameters, GEMMs, saved activations);
the context-parallel KV exchange and TP collectives are still priced as for ordinary attention
of that head width.

Sliding-window attention: ``sliding_window`` (keys per query) on the layers ``layer_types`` marks
``sliding_attention`` (GPT-OSS: every other layer), or on every layer when the config has no
``layer_types`` (Mistral-7B-v0.1); ``use_sliding_window: false`` (Qwen2/3) turns it off.

Linear biases (``linear_bias``, Megatron's ``add_bias_linear``) as Megatron-Bridge 0.3.1 derives
them (models/conversion/model_bridge.py CONFIG_MAPPING: ``mlp_bias`` -> add_bias_linear; its
family bridges fix the value where the modeling file does): fixed by ``model_type`` where the
modeling file fixes it (``FIXED_LINEAR_BIAS``), else the family's bias key
(``LINEAR_BIAS_KEYS``: ``mlp_bias``, OPT's ``enable_bias``, Starcoder2's ``use_bias``, Falcon's
``bias``) or, absent, its configuration class's default, else Megatron's default (biases on).

Gated MLP (SwiGLU-style, three matrices): by ``model_type`` where it is known, else when the
activation (``hidden_act``) is silu/swish/swiglu. Tied embeddings: ``tie_word_embeddings`` when
present, else the family's default (tied for gpt2 and gpt_bigcode, untied otherwise).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from placer.errors import PlacerError, short_repr
from placer.spec.model import Model

# model_type values whose MLP is gated (the *MLP classes in transformers' modeling_<type>.py use
# gate_proj/up_proj/down_proj or, for GPT-OSS, a fused gate_up_proj).
GATED_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
    "deepseek_v3", "gpt_oss", "gemma", "gemma2", "phi3", "olmo", "olmo2", "granite",
})
# model_type values with a plain two-matrix MLP (fc_in/fc_out, c_fc/c_proj, dense_h_to_4h).
PLAIN_MLP_MODEL_TYPES = frozenset({
    "gpt2", "gptj", "codegen", "gpt_bigcode", "gpt_neox", "opt", "bloom", "falcon", "phi",
    "starcoder2",
})
GATED_ACTIVATIONS = frozenset({"silu", "swish", "swiglu"})
# model_type -> whether the MLP / expert linears carry biases, where transformers' modeling file
# fixes it with no config key: GPT-OSS's experts always have gate_up_proj_bias/down_proj_bias
# (modeling_gpt_oss.py GptOssExperts; Megatron-Bridge 0.3.1 gpt_oss_bridge.py add_bias_linear
# True); GPT-2 style Conv1D/Linear MLPs, BLOOM, GPT-NeoX and Phi MLPs are nn.Linear/Conv1D with
# biases; Mistral, Mixtral, Qwen2(-MoE) (QKV bias only: Megatron add_qkv_bias), Qwen3(-MoE),
# DeepSeek-V2/V3, Gemma(2), OLMo(2), OLMoE and Phi-3 MLPs are bias-free (bias=False; Bridge 0.3.1's
# qwen2/qwen3/qwen3_moe/deepseek_v2/deepseek_v3/gemma/gemma2/olmoe bridges and the mistral
# provider set add_bias_linear False).
FIXED_LINEAR_BIAS = {
    "gpt_oss": True, "gpt2": True, "gptj": True, "codegen": True, "gpt_bigcode": True,
    "bloom": True, "gpt_neox": True, "phi": True,
    "mistral": False, "mixtral": False, "qwen2": False, "qwen2_moe": False, "qwen3": False,
    "qwen3_moe": False, "deepseek_v2": False, "deepseek_v3": False, "gemma": False,
    "gemma2": False, "olmo": False, "olmo2": False, "olmoe": False, "phi3": False,
}
# model_type -> (the config key that switches its linear biases, the configuration class's
# default when config.json leaves it out): LlamaConfig/GraniteConfig mlp_bias False (transformers
# configuration_llama.py, configuration_granite.py), OPTConfig enable_bias True, Starcoder2Config
# use_bias True, FalconConfig bias False. Other families: ``mlp_bias`` when present.
LINEAR_BIAS_KEYS = {
    "llama": ("mlp_bias", False), "granite": ("mlp_bias", False), "opt": ("enable_bias", True),
    "starcoder2": ("use_bias", True), "falcon": ("bias", False),
}
MEGATRON_LINEAR_BIAS = True
"""megatron-core TransformerConfig.add_bias_linear's default (transformer_config.py)."""
TIED_BY_DEFAULT = frozenset({"gpt2", "gpt_bigcode"})
GPT2_STYLE = frozenset({"gpt2", "gptj", "codegen", "gpt_bigcode"})
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9._+-]+")


@dataclass(frozen=True)
class _Keys:
    """The HF key names of the base fields in one family of configs."""

    layers: str
    hidden: str
    heads: str
    ffn: str
    positions: str
    activation: str


STANDARD_KEYS = _Keys("num_hidden_layers", "hidden_size", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "hidden_act")
GPT2_KEYS = _Keys("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "activation_function")


def is_hf_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "num_hidden_layers" in data or "n_layer" in data


class _Reader:
    """Typed access to the keys of one config, with one-line errors naming the HF key."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data = data
        self.source = source
        self.model_type = str(data.get("model_type") or "")

    def _missing(self, key: str) -> PlacerError:
        kind = f"a {self.model_type!r}" if self.model_type else "this"
        hint = ""
        if isinstance(self.data.get("text_config"), dict):
            hint = " (its language model is nested under text_config, which placer does not read)"
        return PlacerError(
            f"{self.source}: Hugging Face key {key!r} is missing; {kind} config.json needs it{hint}"
        )

    def integer(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        """A required integer (or ``default`` when absent or null)."""
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise self._missing(key)
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PlacerError(
                f"{self.source}: Hugging Face key {key!r} is {short_repr(value)}; "
                f"expected an integer >= {minimum}"
            )
        return value

    def optional_int(self, key: str) -> int | None:
        return None if self.data.get(key) is None else self.integer(key)

    def optional_positive(self, key: str) -> float | None:
        """A positive number, or None when absent or null."""
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise PlacerError(
                f"{self.source}: Hugging Face key {key!r} is {short_repr(value)}; expected a "
                "positive number"
            )
        return float(value)

    def first_int(self, *keys: str) -> int:
        """The first of ``keys`` that is present; the error names the first one."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.integer(key)
        raise self._missing(keys[0])

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise PlacerError(
                f"{self.source}: Hugging Face key {key!r} is {short_repr(value)}; expected true "
                "or false"
            )
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value
        ):
            raise PlacerError(
                f"{self.source}: Hugging Face key {key!r} is {short_repr(value)}; expected a list "
                "of layer indices"
            )
        return value


def model_from_hf_config(data: dict[str, Any], default_name: str, source: str) -> Model:
    """The placer Model described by a Hugging Face ``config.json`` already parsed to ``data``."""
    from placer.spec.presets import validated

    read = _Reader(data, source)
    gpt2_style = read.model_type in GPT2_STYLE or (
        "n_layer" in data and "num_hidden_layers" not in data
    )
    keys = GPT2_KEYS if gpt2_style else STANDARD_KEYS
    num_layers = read.integer(keys.layers)
    hidden = read.integer(keys.hidden)
    heads = read.integer(keys.heads)
    if gpt2_style:
        ffn = read.integer(keys.ffn, default=4 * hidden)
        kv_heads = 1 if read.flag("multi_query", False) else None
    else:
        ffn = read.integer(keys.ffn)
        kv_heads = read.optional_int("num_key_value_heads")
    fields: dict[str, Any] = {
        "name": _model_name(data, default_name),
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": _head_dim(read, hidden, heads),
        "ffn_hidden_size": ffn,
        "gated_mlp": _gated(read, keys),
        "vocab_size": read.integer("vocab_size"),
        "tied_embeddings": read.flag("tie_word_embeddings", read.model_type in TIED_BY_DEFAULT),
        "linear_bias": _linear_bias(read),
        "max_seq_len": read.optional_int(keys.positions),
        # GPT-OSS's swiglu_limit: modeling_gpt_oss.py GptOssExperts clamps the gate and up
        # halves to it.
        "activation_clamp": read.optional_positive("swiglu_limit"),
        "moe": _moe(read, num_layers),
        "mla": _mla(read),
    }
    fields.update(_sliding_window(read, num_layers))
    return validated(Model, fields, source)


def _model_name(data: dict[str, Any], default_name: str) -> str:
    raw = data.get("_name_or_path")
    name = raw.rstrip("/").split("/")[-1] if isinstance(raw, str) else ""
    name = _NAME_BAD_CHARS.sub("-", name or default_name).strip("-._+")[:96]
    return name or "hf-model"


def _mla(read: _Reader) -> dict[str, Any] | None:
    """DeepSeek's latent attention keys (modeling_deepseek_v3.py), when the config has them."""
    if read.data.get("kv_lora_rank") is None:
        return None
    return {"q_lora_rank": read.optional_int("q_lora_rank"),
            "kv_lora_rank": read.integer("kv_lora_rank"),
            "qk_rope_head_dim": read.integer("qk_rope_head_dim", default=0, minimum=0),
            "v_head_dim": read.integer("v_head_dim")}


def _head_dim(read: _Reader, hidden: int, heads: int) -> int | None:
    """Explicit head width, kept only where hidden_size / heads would be wrong."""
    if read.data.get("qk_nope_head_dim") is not None:  # MLA: the query/key head width
        head_dim = read.integer("qk_nope_head_dim") + read.integer("qk_rope_head_dim", default=0,
                                                           minimum=0)
    else:
        head_dim = read.optional_int("head_dim")
    if head_dim is None or (hidden % heads == 0 and head_dim == hidden // heads):
        return None
    return head_dim


def _sliding_window(read: _Reader, num_layers: int) -> dict[str, Any]:
    """Sliding-window attention: ``layer_types`` names each layer's kind (GPT-OSS, Gemma); without
    it a set ``sliding_window`` applies to every layer (Mistral-7B-v0.1) unless
    ``use_sliding_window`` is false (Qwen2/3 keep the key but turn the window off)."""
    window = read.data.get("sliding_window")
    if window is None or read.data.get("use_sliding_window") is False:
        return {}
    window = read.integer("sliding_window")
    kinds = read.data.get("layer_types")
    if kinds is None:
        return {"sliding_window": window}
    if not isinstance(kinds, list) or len(kinds) != num_layers or not all(
        isinstance(k, str) for k in kinds
    ):
        raise PlacerError(
            f"{read.source}: Hugging Face key 'layer_types' is {short_repr(kinds)}; expected one "
            f"attention kind per layer ({num_layers} strings)"
        )
    sliding = sum(kind == "sliding_attention" for kind in kinds)
    return {"sliding_window": window, "sliding_window_layers": sliding} if sliding else {}


def _linear_bias(read: _Reader) -> bool:
    """Whether the MLP / expert linears carry biases (module docstring, "Linear biases")."""
    if read.model_type in FIXED_LINEAR_BIAS:
        return FIXED_LINEAR_BIAS[read.model_type]
    key, default = LINEAR_BIAS_KEYS.get(read.model_type, ("mlp_bias", MEGATRON_LINEAR_BIAS))
    return read.flag(key, default)


def _gated(read: _Reader, keys: _Keys) -> bool:
    if read.model_type in GATED_MODEL_TYPES:
        return True
    if read.model_type in PLAIN_MLP_MODEL_TYPES:
        return False
    return str(read.data.get(keys.activation, "")).lower() in GATED_ACTIVATIONS


def _moe(read: _Reader, num_layers: int) -> dict[str, Any] | None:
    """MoE fields from whichever expert-count key the config uses; None for a dense model."""
    data = read.data
    shared, shared_ffn = 0, None
    if data.get("n_routed_experts"):  # DeepSeek-V2/V3 (modeling_deepseek.py DecoderLayer)
        experts = read.integer("n_routed_experts")
        expert_ffn = read.integer("moe_intermediate_size")
        shared = read.integer("n_shared_experts", default=0, minimum=0)
        shared_ffn = expert_ffn if shared else None
        first_k = read.integer("first_k_dense_replace", default=0, minimum=0)
        freq = read.integer("moe_layer_freq", default=1)
        moe_layers = [i for i in range(num_layers) if i >= first_k and i % freq == 0]
        pattern_key = "moe_layer_freq"
    elif data.get("num_local_experts"):  # Mixtral, GPT-OSS: every layer is MoE
        experts = read.integer("num_local_experts")
        expert_ffn = read.integer("intermediate_size")
        moe_layers = list(range(num_layers))
        pattern_key = "num_local_experts"
    elif data.get("num_experts"):  # Qwen2-MoE, Qwen3-MoE (modeling_qwen3_moe.py DecoderLayer)
        experts = read.integer("num_experts")
        expert_ffn = read.integer("moe_intermediate_size")
        shared_ffn = read.optional_int("shared_expert_intermediate_size")
        shared = 1 if shared_ffn else 0
        step = read.integer("decoder_sparse_step", default=1)
        dense_only = set(read.int_list("mlp_only_layers"))
        moe_layers = [i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0]
        pattern_key = "mlp_only_layers" if dense_only else "decoder_sparse_step"
    else:
        return None
    if not moe_layers:
        return None
    first_dense, frequency = _layer_pattern(moe_layers, num_layers, read, pattern_key)
    return {
        "num_experts": experts,
        "top_k": read.first_int("num_experts_per_tok", "experts_per_token"),
        "expert_ffn_hidden_size": expert_ffn,
        "num_shared_experts": shared,
        "shared_expert_ffn_hidden_size": shared_ffn,
        "first_dense_layers": first_dense,
        "layer_frequency": frequency,
    }


def _layer_pattern(moe_layers: list[int], num_layers: int, read: _Reader,
                   key: str) -> tuple[int, int]:
    """(first_dense_layers, layer_frequency) that select exactly ``moe_layers``."""
    first = moe_layers[0]
    frequency = moe_layers[1] - first if len(moe_layers) > 1 else max(1, num_layers - first)
    if moe_layers != list(range(first, num_layers, frequency)):
        raise PlacerError(
            f"{read.source}: Hugging Face key {key!r} gives MoE layers {short_repr(moe_layers)}, "
            "which are not 'some dense layers, then every k-th layer'; describe the model in a "
            "placer model file (see `placer schema model`)"
        )
    return first, frequency
