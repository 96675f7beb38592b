"""Decoder-only transformer description, dense or mixture-of-experts."""

from __future__ import annotations

from pydantic import Field, model_validator

from placer.spec.base import Spec
from placer.spec.cluster import NAME_PATTERN


class MoE(Spec):
    """Mixture-of-experts settings (Mixtral, Qwen3-MoE, DeepSeek-V3 style)."""

    num_experts: int = Field(ge=1, le=65_536)
    top_k: int = Field(ge=1, le=64)
    expert_ffn_hidden_size: int = Field(ge=1, le=10**6)
    num_shared_experts: int = Field(default=0, ge=0, le=64)
    shared_expert_ffn_hidden_size: int | None = Field(default=None, ge=1, le=10**6)
    first_dense_layers: int = Field(
        default=0, ge=0, description="leading layers with a dense MLP (DeepSeek-V3: 3)"
    )
    layer_frequency: int = Field(default=1, ge=1, description="every k-th layer after is MoE")

    @model_validator(mode="after")
    def _top_k(self) -> MoE:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k {self.top_k} exceeds num_experts {self.num_experts}")
        return self


class MLA(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2; arXiv:2405.04434 section 2.1).

    Queries come from a rank-``q_lora_rank`` latent (or straight from the hidden state when it is
    null, DeepSeek-V2-Lite), keys and values from one shared rank-``kv_lora_rank`` latent plus a
    ``qk_rope_head_dim``-wide rotary key shared by all heads. The model's ``head_dim`` is the
    query/key head width (``qk_nope_head_dim + qk_rope_head_dim``: 192 for DeepSeek-V3).
    """

    q_lora_rank: int | None = Field(
        default=None, ge=1, le=10**6,
        description="rank of the query down-projection (DeepSeek-V3 1536; null: none)")
    kv_lora_rank: int = Field(ge=1, le=10**6, description="rank of the shared KV latent (512)")
    qk_rope_head_dim: int = Field(
        ge=0, le=100_000, description="rotary part of each query/key head, inside head_dim (64)")
    v_head_dim: int = Field(ge=1, le=100_000, description="width of each value head (128)")


class Model(Spec):
    """What the cost model needs of a transformer; head_dim defaults to hidden/heads."""

    name: str = Field(pattern=NAME_PATTERN, max_length=96)
    num_layers: int = Field(ge=1, le=10_000)
    hidden_size: int = Field(ge=1, le=10**6)
    num_attention_heads: int = Field(ge=1, le=10_000)
    num_kv_heads: int | None = Field(default=None, ge=1, le=10_000)
    head_dim: int | None = Field(default=None, ge=1, le=100_000)
    ffn_hidden_size: int = Field(ge=1, le=10**7)
    gated_mlp: bool = Field(default=True, description="SwiGLU-style gated MLP (3 matrices)")
    vocab_size: int = Field(ge=1, le=10**7)
    tied_embeddings: bool = False
    linear_bias: bool = Field(
        default=True, description="the attention and MLP (expert) linear layers carry biases: "
        "Megatron's add_bias_linear, on unless --disable-bias-linear (megatron-core "
        "transformer_config.py); GPT-2/3, BLOOM, GPT-OSS on; Llama, Mistral, Mixtral, Qwen, "
        "DeepSeek off. QKV-only biases (Qwen2, Megatron add_qkv_bias) do not count. Megatron "
        "runs MoE with biases only at etp=1")
    max_seq_len: int | None = Field(default=None, ge=1, le=100_000_000)
    activation_clamp: float | None = Field(
        default=None, gt=0.0, le=1e6,
        description="the gated MLP clamps its two halves to this limit before the activation "
        "(GPT-OSS 7.0: Hugging Face swiglu_limit, Megatron activation_func_clamp_value)")
    sliding_window: int | None = Field(
        default=None, ge=1, le=100_000_000,
        description="keys a sliding-window attention layer sees (Mistral-7B-v0.1 4096, GPT-OSS 128)"
    )
    sliding_window_layers: int | None = Field(
        default=None, ge=0, le=10_000,
        description="how many layers use the window (default: all; GPT-OSS alternates: half)"
    )
    hidden_dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="dropout before each residual add (GPT-3/Megatron 0.1; Llama, Qwen 0): a "
        "kept 1-byte mask per element")
    attention_dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="dropout on the attention probabilities (kept as a mask only by unfused "
        "attention; flash attention regenerates it)")
    moe: MoE | None = None
    mla: MLA | None = Field(
        default=None, description="multi-head latent attention (DeepSeek-V2/V3); head_dim is then "
        "the query/key head width")

    @model_validator(mode="after")
    def _heads(self) -> Model:
        kv = self.kv_heads
        if kv > self.num_attention_heads or self.num_attention_heads % kv:
            raise ValueError(
                f"num_kv_heads {kv} must divide num_attention_heads {self.num_attention_heads}"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; set head_dim"
            )
        if self.mla is not None:
            self._check_mla(self.mla)
        if self.moe and self.moe.first_dense_layers > self.num_layers:
            raise ValueError(f"moe.first_dense_layers {self.moe.first_dense_layers} exceeds "
                             f"num_layers {self.num_layers}")
        if self.sliding_window_layers is not None:
            if self.sliding_window_layers > self.num_layers:
                raise ValueError(f"sliding_window_layers {self.sliding_window_layers} exceeds "
                                 f"num_layers {self.num_layers}")
            if self.sliding_window is None and self.sliding_window_layers:
                raise ValueError("sliding_window_layers is set but sliding_window is not; set the "
                                 "window size in tokens")
        return self

    def _check_mla(self, mla: MLA) -> None:
        if self.kv_heads != self.num_attention_heads:
            raise ValueError(
                f"num_kv_heads {self.kv_heads} with mla: latent attention has one KV head per "
                f"query head; set num_kv_heads to {self.num_attention_heads} or leave it out")
        if mla.qk_rope_head_dim >= self.attention_head_dim:
            raise ValueError(
                f"mla.qk_rope_head_dim {mla.qk_rope_head_dim} is not below head_dim "
                f"{self.attention_head_dim}; head_dim is the whole query/key head "
                "(qk_nope_head_dim + qk_rope_head_dim)")

    @property
    def value_head_dim(self) -> int:
        """Width of one value head: MLA's v_head_dim, else the query/key head width."""
        return self.mla.v_head_dim if self.mla is not None else self.attention_head_dim

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def num_sliding_window_layers(self) -> int:
        """Layers whose attention is limited to ``sliding_window`` keys."""
        if self.sliding_window is None:
            return 0
        return self.num_layers if self.sliding_window_layers is None else self.sliding_window_layers

    def is_moe_layer(self, layer: int) -> bool:
        """Whether 0-based ``layer`` has an MoE block instead of a dense MLP."""
        if self.moe is None or layer < self.moe.first_dense_layers:
            return False
        return (layer - self.moe.first_dense_layers) % self.moe.layer_frequency == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))
