"""Parameter counts of a decoder-only transformer, and how pipeline stages split its layers.

Counts follow Megatron's estimator (docs/sources.md section 9.1): attention ``h x d x (2a + 2g)``
for query/output projections of ``a`` heads and key/value projections of ``g`` groups, an MLP of
2 (plain) or 3 (gated) ``h x ffn`` matrices, two RMS/LayerNorm weight vectors per layer, a
``V x h`` embedding and, unless tied, a ``V x h`` output layer. Biases are left out (under 0.1 %).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.pipeline import PipelineSplit


def mlp_matrices(model: Model) -> int:
    """Weight matrices of one MLP (gate, up, down for gated MLPs; in, out otherwise)."""
    return 3 if model.gated_mlp else 2


def attention_projection_params(model: Model) -> int:
    """Q, K, V and output projection weights of one layer (the attention GEMMs' shapes)."""
    h, d = model.hidden_size, model.attention_head_dim
    if model.mla is not None:
        return sum(k * n for _, k, n in mla_projections(model))
    return h * d * (2 * model.num_attention_heads + 2 * model.kv_heads)


def mla_projections(model: Model) -> tuple[tuple[str, int, int], ...]:
    """(name, K, N) of each latent-attention weight, in megatron-core's names
    (multi_latent_attention.py, megatron-core 0.16.1): the query down/up projections (or one
    query projection without ``q_lora_rank``), the KV down projection to the latent and the
    shared rotary key, the KV up projection to every head's non-rotary key and value, and the
    output projection of the value heads."""
    mla = model.mla
    assert mla is not None
    h, d, a = model.hidden_size, model.attention_head_dim, model.num_attention_heads
    nope, v = d - mla.qk_rope_head_dim, mla.v_head_dim
    query: tuple[tuple[str, int, int], ...] = (("q_proj", h, a * d),)
    if mla.q_lora_rank is not None:
        query = (("q_down_proj", h, mla.q_lora_rank), ("q_up_proj", mla.q_lora_rank, a * d))
    return (*query, ("kv_down_proj", h, mla.kv_lora_rank + mla.qk_rope_head_dim),
            ("kv_up_proj", mla.kv_lora_rank, a * (nope + v)), ("proj", a * v, h))


def tp_replicated_params(model: Model) -> int:
    """Weights of one layer that every TP rank holds whole: MLA's down projections and latent
    norms (megatron-core 0.16.1 builds the down projections as TELinear
    ``parallel_mode='duplicated'``); 0 for other attention."""
    if model.mla is None:
        return 0
    down = sum(k * n for name, k, n in mla_projections(model) if name.endswith("down_proj"))
    return down + (model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank


def attention_params(model: Model) -> int:
    """Q, K, V and output projections of one layer, plus its two norm weight vectors (and MLA's
    norms of its query and KV latents)."""
    latent_norms = 0
    if model.mla is not None:
        latent_norms = (model.mla.q_lora_rank or 0) + model.mla.kv_lora_rank
    return attention_projection_params(model) + 2 * model.hidden_size + latent_norms


def dense_mlp_params(model: Model) -> int:
    return mlp_matrices(model) * model.hidden_size * model.ffn_hidden_size


def expert_params(model: Model) -> int:
    """Routed experts of one MoE layer (sharded over expert parallelism)."""
    if model.moe is None:
        return 0
    return model.moe.num_experts * mlp_matrices(model) * model.hidden_size * (
        model.moe.expert_ffn_hidden_size)


def active_expert_params(model: Model) -> int:
    """Routed-expert weights one token passes through in an MoE layer (its top-k experts)."""
    if model.moe is None:
        return 0
    return model.moe.top_k * mlp_matrices(model) * model.hidden_size * (
        model.moe.expert_ffn_hidden_size)


def shared_expert_ffn(model: Model) -> int:
    """FFN width of one shared expert: its own, else the routed experts' (Megatron, DeepSeek)."""
    moe = model.moe
    if moe is None:
        return 0
    return moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size


def shared_expert_params(model: Model) -> int:
    """Shared experts of one MoE layer (every token runs them)."""
    if model.moe is None:
        return 0
    return (model.moe.num_shared_experts * mlp_matrices(model) * model.hidden_size
            * shared_expert_ffn(model))


def router_params(model: Model) -> int:
    return model.hidden_size * model.moe.num_experts if model.moe is not None else 0


def moe_shared_params(model: Model) -> int:
    """Router and shared experts of one MoE layer (replicated like dense weights)."""
    return shared_expert_params(model) + router_params(model)


def largest_weight_params(model: Model, layout: Layout) -> float:
    """Parameters of a layer's largest weight on one GPU: the fused QKV, the first MLP (gate and
    up fused) or one expert's first matrix, as Megatron fuses them."""
    h, d = model.hidden_size, model.attention_head_dim
    qkv = h * d * (model.num_attention_heads + 2 * model.kv_heads) / layout.tp
    if model.mla is not None:  # down projections are whole on every TP rank, the rest split
        qkv = max(k * n / (1 if name.endswith("down_proj") else layout.tp)
                  for name, k, n in mla_projections(model))
    gate = mlp_matrices(model) - 1
    mlp = h * model.ffn_hidden_size * gate / layout.tp
    expert = 0.0
    if model.moe is not None:
        expert = h * model.moe.expert_ffn_hidden_size * gate / layout.etp
    return max(qkv, mlp, expert)


def embedding_params(model: Model) -> int:
    return model.vocab_size * model.hidden_size


@lru_cache(maxsize=4096)
def _moe_layer_flags(model: Model) -> tuple[bool, ...]:
    return tuple(model.is_moe_layer(i) for i in range(model.num_layers))


def num_moe_layers(model: Model) -> int:
    """MoE layers of the model (cached: the solver asks for every candidate)."""
    return sum(_moe_layer_flags(model))


def total_params(model: Model) -> int:
    """Every parameter of the model (the N in 6N)."""
    moe_layers = num_moe_layers(model)
    dense_layers = model.num_layers - moe_layers
    output = 0 if model.tied_embeddings else embedding_params(model)
    return (model.num_layers * attention_params(model) + dense_layers * dense_mlp_params(model)
            + moe_layers * (expert_params(model) + moe_shared_params(model))
            + embedding_params(model) + output + model.hidden_size)


@dataclass(frozen=True)
class StageShape:
    """What one pipeline rank holds: its layers and which ends of the model it owns."""

    stage: int
    layers: int
    moe_layers: int
    first: bool
    last: bool

    @property
    def kind(self) -> tuple[int, int, bool, bool]:
        """Everything but the position: stages of one kind hold the same work and parameters."""
        return (self.layers, self.moe_layers, self.first, self.last)


def stage_shapes(model: Model, layout: Layout) -> list[StageShape]:
    """Every pipeline rank's share of the model (O(layers), no rank enumeration; cached)."""
    return list(_stage_shapes(model, layout.pipeline_split(model.num_layers)))


@lru_cache(maxsize=4096)
def _stage_shapes(model: Model, split: PipelineSplit) -> tuple[StageShape, ...]:
    """Virtual stages in model order, each added to the rank that runs it: looped, or V-shaped
    for ZB-V and DualPipeV, where rank 0 runs both the first and the last stage (embedding and
    output layer on one rank)."""
    flags = _moe_layer_flags(model)
    pp = split.pp
    layers = [0] * pp
    moe_layers = [0] * pp
    start = 0
    for chunk, size in enumerate(split.chunks):
        rank = split.rank_of(chunk)
        layers[rank] += size
        moe_layers[rank] += sum(flags[start:start + size])
        start += size
    first_rank = split.rank_of(0)
    last_rank = split.rank_of(len(split.chunks) - 1)
    return tuple(StageShape(stage=r, layers=layers[r], moe_layers=moe_layers[r],
                            first=r == first_rank, last=r == last_rank) for r in range(pp))


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds, split by how data parallelism shards them."""

    dense: float  # replicated over dp x cp: attention, dense MLPs, router, shared experts, ends
    expert: float  # replicated over expert-dp only: routed experts

    @property
    def total(self) -> float:
        return self.dense + self.expert


def stage_params(model: Model, layout: Layout, shape: StageShape) -> StageParams:
    """Per-GPU parameters of a stage: dense weights over tp (but MLA's down projections),
    experts over ep x etp (cached on those three degrees, the only layout fields it reads: a
    search asks for every micro-batch, ZeRO stage, recomputation and interleaving of them).

    The first stage holds the embedding; the last holds the output layer, which with tied
    embeddings and pp > 1 is a second copy Megatron keeps in sync (docs/sources.md 9.1).
    """
    return _stage_params(model, layout.tp, layout.ep, layout.etp, shape)


@lru_cache(maxsize=16384)
def _stage_params(model: Model, tp: int, ep: int, etp: int, shape: StageShape) -> StageParams:
    dense_layers = shape.layers - shape.moe_layers
    dense = (shape.layers * attention_params(model) + dense_layers * dense_mlp_params(model)
             + shape.moe_layers * moe_shared_params(model))
    ends = 0
    if shape.first:
        ends += embedding_params(model)
    if shape.last:
        ends += model.hidden_size
        if not (model.tied_embeddings and shape.first):
            ends += embedding_params(model)
    expert = shape.moe_layers * expert_params(model)
    per_gpu = (dense + ends) / tp
    if model.mla is not None:  # down projections whole on each TP rank
        whole = shape.layers * tp_replicated_params(model)
        per_gpu += whole - whole / tp
    return StageParams(dense=per_gpu, expert=expert / (ep * etp))
