"""Peak memory per GPU: weights, gradients, optimizer state, activations, buffers, overheads.

Every pipeline stage is costed and the worst one is reported. Activations follow Korthikanti et
al. 2022 (arXiv:2205.05198, Table 2; docs/sources.md 9.2), generalised to grouped-query attention,
gated MLPs, any FFN width, context parallelism and mixture-of-experts layers. Attention is
fused (flash attention) by default, so the ``5as/h`` score and softmax terms are not stored;
``CostOptions(flash_attention=False)`` restores them, and selective recomputation drops them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from placer.cost import deepspeed_optimizer
from placer.cost.memo import (
    BATCH_FIELDS,
    DP_FIELDS,
    cached,
    layout_fields,
    new_cache,
    text_key,
)
from placer.cost.options import (
    DEEPSPEED_PREFETCH_BUCKET_PARAMS,
    DEEPSPEED_REDUCE_BUCKET_PARAMS,
    MOE_LOAD_IMBALANCE,
    CostOptions,
)
from placer.cost.params import (
    StageParams,
    StageShape,
    embedding_params,
    largest_weight_params,
    shared_expert_ffn,
    stage_params,
    stage_shapes,
    total_params,
)
from placer.cost.pipeline import microbatches_in_flight, parameter_copies, saturated_microbatches
from placer.cost.profile import bounding_node_type, memory_terms
from placer.cost.recompute import offloaded_layers, recomputed_fraction
from placer.cost.stack_options import job_options
from placer.spec.cluster import Cluster
from placer.spec.job import Job, Optimizer
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.profile import LinkProfile
from placer.spec.results import MemoryBreakdown

# CUDA context, kernels and library workspaces per process: ~1 GB with all kernels loaded
# (pytorch#28394), ~0.3 GB with lazy loading (pytorch#107667); cuBLAS/cuDNN/TE workspaces and
# the caching allocator's own blocks take the rest of this allowance.
FRAMEWORK_BASE_BYTES = 1 << 30
# NCCL buffers per communicator: NCCL_BUFFSIZE 4 MiB (docs/sources.md 3) per peer direction, two
# peers on a ring, up to 32 channels: 4 MiB x 2 x 32 = 256 MiB.
NCCL_BYTES_PER_COMMUNICATOR = 4 * 2**20 * 2 * 32
# Allocator fragmentation: the share of reserved memory the caching allocator cannot hand out
# (1 - peak allocated / peak reserved), by whether the backward recomputes activations. GMLake
# (Guo et al., ASPLOS 2024, arXiv:2401.08156) measured PyTorch's caching allocator per strategy,
# fine-tuning OPT-1.3B, Vicuna-13B and GPT-NeoX-20B with DeepSpeed ZeRO-3 on 4 A100-80GB
# (intelligent-machine-learning/glake@2898380 GMLake/README.md "Scalability on Memory-efficient
# Strategy", figures GMLake/docs/figures/stra-{opt-1.3b,vicuna-13b,neox-20b}.png, P-R): utilization
# 0.928 / 0.955 / 0.958 with no strategy (N) and 0.661 / 0.840 / 0.961 with recomputation (R),
# read off the plots (docs/sources.md 9.4). The fractions are the means over the three models:
# 0.053 (0.072, 0.045, 0.042) and 0.179 (0.339, 0.160, 0.039). GMLake's other strategies add LoRA
# and DeepSpeed's optimizer offload, which placer does not plan. Fragmentation comes from the
# irregular allocation and freeing of activations and transient buffers, so the fraction is
# applied to those, not to weights and optimizer state allocated once; gradients count where the
# optimizer frees them and autograd allocates them again each step (CostOptions.grads_reallocated,
# deepspeed_bf16_optimizer).
FRAGMENTATION_FRACTION_NO_RECOMPUTE = 0.053
FRAGMENTATION_FRACTION_RECOMPUTE = 0.179
# Output logits and cross-entropy: the forward keeps 4 bytes per vocabulary entry per token (the
# fp32 softmax or log-softmax, as in Megatron's estimator, 4*s*b*V, docs/sources.md 9.2); the
# peak comes in the loss backward. Megatron's vocab-parallel cross-entropy
# (megatron/core/tensor_parallel/cross_entropy.py) works in place on the fp32 logits and turns
# the saved softmax into the gradient, which is cast to bf16 for the output layer: 4 + 2 bytes.
# An unfused ``F.cross_entropy(logits.float())`` (torchtitan) peaks at 12 bytes per entry in its
# backward (fp32 log-softmax, its gradient, the input gradient and the bf16 copy), measured with
# PyTorch's MemTracker in tests/test_memory_pytorch.py.
# A torch.compile'd cross-entropy (torchtitan with --training.compile) saves only the bf16 logits
# (2 bytes, measured in tests/test_memory_pytorch.py) and its fused backward writes the bf16
# gradient: 4 bytes per entry at the peak.
LOGITS_BYTES_PER_ENTRY = 4
FUSED_LOSS_PEAK_BYTES_PER_ENTRY = 6
EAGER_LOSS_PEAK_BYTES_PER_ENTRY = 12
COMPILED_LOSS_PEAK_BYTES_PER_ENTRY = 4
# torchtitan runs that cross-entropy under DTensor's loss_parallel whenever TP > 1 (the output
# layer's logits stay sharded over the vocabulary; torchtitan@9dec370 parallel_dims.py
# loss_parallel_enabled: tp > 1 and not --training.disable_loss_parallel, which is False by
# default).
# loss_parallel's own ops (torch/distributed/tensor/parallel/loss.py, torch 2.13): the forward's
# _log_softmax saves its fp32 result, and _nll_loss_backward returns
# (grad_input + exp(x)) * grad_output from an fp32 one-hot grad_input: the saved result, the
# one-hot, exp(x) and their sum are live at once, 16 bytes per entry (measured with the
# PyTorch profiler's allocation events in tests/test_memory_pytorch.py, 4 more than plain).
LOSS_PARALLEL_PEAK_BYTES_PER_ENTRY = 16
# Transformer Engine's fused cross-entropy (transformer_engine/pytorch/cross_entropy.py,
# CrossEntropyFunction; triton/cross_entropy.py) saves its input logits in their own dtype (bf16)
# and its backward kernel stores the gradient into them in place: 2 bytes per entry (plus 12 per
# token of fp32 max/sum/target logit, negligible beside the vocabulary).
TE_LOSS_PEAK_BYTES_PER_ENTRY = 2
# The flash-attn package's fused CrossEntropyLoss (flash_attn/ops/triton/cross_entropy.py;
# llm-foundry's MPT uses it by default: llmfoundry/models/mpt/modeling_mpt.py
# ComposerMPTCausalLM, loss_fn 'fused_crossentropy', called on the bf16 logits) saves its bf16
# input and fp32 log-sum-exp per token, and without inplace_backward (its default) writes the
# gradient into a new tensor of the logits' dtype: 2 + 2 bytes per entry at the peak.
FLASH_ATTN_LOSS_PEAK_BYTES_PER_ENTRY = 4
# Token ids held per in-flight micro-batch on the first stage (int64, Megatron's estimator 8*s*b);
# with hidden dropout the embedding's dropout mask adds one byte per element (s*b*h).
EMBEDDING_ID_BYTES_PER_TOKEN = 8
BF16_BYTES = 2
FP8_BYTES = 1
FP32_BYTES = 4
# NVFP4 (Transformer Engine's NVFP4BlockScaling, docs/features/low_precision_training/nvfp4/
# nvfp4.rst): a 4-bit E2M1 value per element and one FP8 E4M3 scale per block of 16 (a per-tensor
# FP32 scale is negligible). TE's Linear keeps its quantized input for the backward, only the
# column-wise copy the wgrad GEMM reads (NVIDIA/TransformerEngine@d0067d0
# transformer_engine/pytorch/module/linear.py: "Discard row-wise data since it is not needed in
# backward pass"), so an NVFP4 linear saves its input at this size.
NVFP4_BYTES = 0.5 + 1 / 16
ROUTER_PROB_BYTES = 4  # fp32 router probability kept per routed token
# Routing bookkeeping Megatron-Core keeps for backward (moe/router.py, moe/moe_utils.py permute
# and unpermute): the int64 top-k indices (the scatter into the routing map), the bool routing
# map (masked_select's mask), the transposed fp32 probabilities masked_select keeps, and one
# int64 sorted index per routed copy (index_select in permute, scatter_add in unpermute).
TOPK_INDEX_BYTES = 8
ROUTING_MAP_BYTES = 1
SORTED_INDEX_BYTES = 8
# A norm keeps its fp32 reciprocal standard deviation per token (the fused RMSNorm of TE and of
# PyTorch's ``aten._fused_rms_norm`` save input, rstd and weight).
NORM_STAT_BYTES = 4


@dataclass(frozen=True)
class ActivationParts:
    """Bytes per token one layer saves for backward on one GPU, by what saves them.

    ``total`` is what the layer keeps without recomputation. ``checkpoint`` is the layer input
    (what full recomputation keeps); ``op_saved`` what torchtitan's op-level selective
    checkpointing keeps beyond it; ``backward_working`` the gradient buffers alive at once inside
    the layer's backward (measured: the first MLP GEMM's output gradient and one h-wide one).
    """

    norms: float  # both norms' inputs and fp32 rstd
    linear_inputs: float  # inputs of the QKV projection and the first MLP linear (router input)
    qkv: float  # q, k, v as the attention kernel saves them
    core_out: float  # attention output, the output projection's input (+ its FP8 copy)
    softmax: float  # log-sum-exp (flash) or scores, softmax and dropout mask (unfused)
    mlp_inner: float  # activation inputs and second linear's input; MoE routed copies, probs
    dropout: float  # hidden-dropout masks
    checkpoint: float
    op_saved: float
    backward_working: float
    modules: tuple[tuple[str, float], ...] = ()
    """Bytes per token each Megatron ``--recompute-modules`` entry releases (core_attn: the
    softmax statistics or scores; layernorm: the norm outputs, i.e. the linear inputs; mlp / moe:
    the MLP's or MoE block's inner tensors; moe_act: the expert activation outputs;
    shared_experts: the shared experts' inner tensors; mla_up_proj: MLA's q, k and v, 0 for
    other attention)."""
    op_unread: float = 0.0
    """Of ``op_saved``, what a torch.compile'd layer does not keep: outputs the policy saves
    that its backward never reads (CostOptions.compiled_layers)."""

    @property
    def total(self) -> float:
        return (self.norms + self.linear_inputs + self.qkv + self.core_out + self.softmax
                + self.mlp_inner + self.dropout)

    def released(self, modules: tuple[str, ...] | None) -> float:
        """Bytes per token the selective ``modules`` release (default Megatron's core_attn)."""
        chosen = modules or ("core_attn",)
        return sum(b for name, b in self.modules if name in chosen) if self.modules else (
            self.softmax if "core_attn" in chosen else 0.0)

    def kept(self, recompute: str, modules: tuple[str, ...] | None = None) -> float:
        """What the layer holds between its forward and backward under ``recompute``.

        ``selective`` is Megatron's recomputation of ``modules`` (default core_attn: q, k, v are
        its checkpoint inputs and its output is the projection's saved input, so only the
        softmax statistics or unfused scores go; see ``modules``). ``op`` is torchtitan's
        op-level selective checkpointing: the layer input plus the outputs of SDPA and of every
        other matmul. ``full``: the input.
        """
        if recompute == "none":
            return self.total
        if recompute == "selective":
            return self.total - self.released(modules)
        if recompute == "op":
            return self.checkpoint + self.op_saved - self.op_unread
        if recompute == "full":
            return self.checkpoint
        raise ValueError(f"unknown recompute mode {recompute!r}")

    def backward_peak(self, recompute: str, modules: tuple[str, ...] | None = None) -> float:
        """Bytes above what is kept while this layer runs its backward: what it recomputes
        first (full: the whole layer; op: all but what op-level checkpointing saved; selective:
        the largest recomputed module, one at a time) and the gradient working set."""
        redo = {"full": self.total, "op": self.total - self.op_saved}.get(recompute, 0.0)
        if recompute == "selective":
            chosen = modules or ("core_attn",)
            redo = max((b for name, b in self.modules if name in chosen), default=0.0)
        if recompute == "op":
            redo -= self.checkpoint
        return max(0.0, redo) + self.backward_working


def _mlp_inner_bytes(ffn_local: float, gated: bool, lin: float, fused: bool) -> float:
    """Per token, inside one (expert) MLP after its first linear: activation-function inputs,
    and the second linear's input. Eager SwiGLU also keeps the SiLU output and the two halves
    as separate GEMM outputs (``silu(w1 x) * w3 x``): 8 bytes per column instead of 6."""
    if gated and not fused:
        return 4 * BF16_BYTES * ffn_local
    return BF16_BYTES * ffn_local * (2 if gated else 1) + lin * ffn_local


def activation_bytes_per_token(model: Model, layout: Layout, moe_layer: bool, *,
                               flash_attention: bool = True, seq_len: int = 0,
                               fp8: bool = False,
                               moe_load_imbalance: float = MOE_LOAD_IMBALANCE,
                               fused_kernels: bool = True, fp4: bool = False,
                               compiled: bool = False) -> ActivationParts:
    """Saved activation bytes per token of one layer on one GPU (Korthikanti, generalised).

    With a plain MHA model of FFN 4h, no flash attention, dropout and tp = t this is Table 2:
    ``h (10 + 24/t + 5as/(ht))`` per token, ``34h/t`` with sequence parallelism (plus the norms'
    fp32 statistics). ``seq_len`` (the attended length) only matters without flash attention.
    With ``fp8`` Transformer Engine keeps the inputs of the linear layers in FP8 (1 byte), with
    ``fp4`` (its NVFP4 recipe on the linears of an FP8 job) in NVFP4 (NVFP4_BYTES).
    ``compiled`` (eager modules under torch.compile, CostOptions.compiled_layers): op-level
    checkpointing keeps only the saved outputs the backward reads.
    Every term is checked against PyTorch blocks in tests/test_memory_pytorch.py.
    """
    h, d, a = model.hidden_size, model.attention_head_dim, model.num_attention_heads
    t = layout.tp
    rep = layout.sp_replication  # of the tensors TP would otherwise replicate
    kv = layout.kv_heads_per_gpu(model.kv_heads)
    b = BF16_BYTES
    fused = fused_kernels
    lin: float = BF16_BYTES  # inputs of linear layers, as the linears save them
    if fp8 and fused:
        lin = NVFP4_BYTES if fp4 else FP8_BYTES
    # Megatron's SP linears save the local shard; DTensor saves the all-gathered input.
    gathered = rep if fused else 1.0
    heads = a / t
    norms = 2 * (b * h + NORM_STAT_BYTES) * rep
    attn_input = lin * h * gathered
    if fused:
        qkv = b * d * (heads + 2 * kv)
        core_out = b * heads * d + (lin * heads * d if lin != b else 0.0)
    else:  # torchtitan's repeat_kv copies K and V to the query heads (a view for one KV head)
        qkv = b * d * (heads + 2 * (heads if kv > 1 else kv))
        core_out = b * heads * d
    up_proj = 0.0
    if model.mla is not None:
        attn_input, qkv, core_out, up_proj = _mla_parts(model, layout, lin, gathered)
    if flash_attention:
        softmax = FP32_BYTES * heads  # log-sum-exp per head
    else:  # scores' softmax (2 bytes), and with attention dropout its mask and output (3 more)
        softmax = (2 + (3 if model.attention_dropout > 0 else 0)) * heads * seq_len
    dropout = 2 * h * rep if model.hidden_dropout > 0 else 0.0
    # torchtitan op-level SAC: outputs of the 1st, 3rd, ... matmul and of SDPA. Eager order is
    # wq, wk, wv, wo, w1, w3, w2 (wq, wv, w1, w2 kept); fused: qkv, wo, gate+up, w2.
    sdpa = b * heads * d + FP32_BYTES * heads
    gate = 2 if model.gated_mlp else 1
    # Saved by the op policy but never read by the backward: a torch.compile'd layer does not
    # keep them (AOTAutograd's partitioner saves what the compiled backward reads;
    # tests/test_memory_pytorch.py).
    op_unread = 0.0
    if moe_layer and model.moe is not None:
        mlp_input, mlp_inner, op_mlp, working, act_out, shared = _moe_parts(
            model, layout, moe_load_imbalance, lin, fused)
        modules = (("moe", mlp_inner), ("moe_act", act_out), ("shared_experts", shared))
    else:
        f = model.ffn_hidden_size / t
        mlp_input = lin * h * gathered
        mlp_inner = _mlp_inner_bytes(f, model.gated_mlp, lin, fused)
        op_mlp = b * f * gate if fused else b * f + (b * h if model.gated_mlp else 0.0)
        if compiled and not fused and model.gated_mlp:
            op_unread += b * h  # w2's output (the 7th matmul) only feeds the residual add
        working = b * f * gate
        modules = (("mlp", mlp_inner),)
    op_attn = b * d * (heads + (2 * kv if fused else kv)) + sdpa
    if model.mla is not None:  # q, k, v at their widths and the attention output
        op_attn = qkv + b * heads * model.value_head_dim + FP32_BYTES * heads
    if layout.sequence_parallel and t > 1:
        # The reduce-scatter outputs (in torchtitan's save list). Compiled, they stay: the
        # backward rebuilds the norm's input from one of them, and the partitioner does not
        # recompute a collective (the test's stand-in reduce-scatter it would recompute).
        op_attn += 2 * b * h * rep
    return ActivationParts(
        norms=norms, linear_inputs=attn_input + mlp_input, qkv=qkv, core_out=core_out,
        softmax=softmax, mlp_inner=mlp_inner, dropout=dropout, checkpoint=b * h * rep,
        op_saved=op_attn + op_mlp, backward_working=working + b * h,
        modules=(("core_attn", softmax), ("layernorm", attn_input + mlp_input),
                 ("mla_up_proj", up_proj), *modules), op_unread=op_unread)


def _mla_parts(model: Model, layout: Layout, lin: float,
               gathered: float) -> tuple[float, float, float, float]:
    """Latent attention per local token: (linear inputs, q/k/v, attention output, what
    ``mla_up_proj`` recomputation releases). megatron-core 0.16.1 multi_latent_attention.py:
    the projections from h (duplicated TELinear down projections, or the column-parallel query
    projection) share one saved input, as the fused QKV projection does; the up projections
    (TELayerNormColumnParallelLinear) save their normed latent input (the local shard under
    sequence parallelism) and the latent norms' input and fp32 rstd; the attention kernel saves
    q and k of
    ``head_dim`` and v of ``v_head_dim`` per local head, which ``mla_up_proj`` output-discarding
    recomputation drops (the up projections and RoPE are rerun in backward)."""
    mla = model.mla
    assert mla is not None
    b, t, h = BF16_BYTES, layout.tp, model.hidden_size
    rep = layout.sp_replication
    heads = model.num_attention_heads / t
    d, dv = model.attention_head_dim, mla.v_head_dim
    latents = (mla.q_lora_rank or 0) + mla.kv_lora_rank
    norms = 2 if mla.q_lora_rank is not None else 1
    down_input = lin * h * gathered  # one saved input for the projections from h
    up_input = lin * latents * gathered + (b * latents + norms * NORM_STAT_BYTES) * rep
    qkv = b * heads * (2 * d + dv)
    core_out = b * heads * dv + (lin * heads * dv if lin != b else 0.0)
    return down_input + up_input, qkv, core_out, qkv


def _moe_parts(model: Model, layout: Layout, imbalance: float, lin: float,
               fused: bool) -> tuple[float, float, float, float, float, float]:
    """MoE block per local token: (router input, routed copies and expert MLPs and shared
    experts, what op-level checkpointing keeps, backward working set, the experts' activation
    outputs (what moe_act recomputation drops), the shared experts' inner tensors)."""
    moe = model.moe
    assert moe is not None
    h, t, b = model.hidden_size, layout.tp, BF16_BYTES
    rep = layout.sp_replication
    gate = 2 if model.gated_mlp else 1
    # Routed tokens each GPU processes per local token (experts span tp x cp x dp).
    routed = moe.top_k * layout.etp / t * imbalance
    fe = moe.expert_ffn_hidden_size / layout.etp
    # Permuted input (first expert GEMM's input), the expert MLP, and the token's fp32 router
    # probability. The probability scales the activation inside the expert (Megatron-Core
    # moe/experts.py: TEGroupedMLP.forward(..., permuted_probs) through
    # weighted_bias_swiglu_impl; torchtitan's MoE scales the input, score_before_experts), so
    # the combine is a plain sum and keeps no copy of the expert output.
    per_routed = lin * h + _mlp_inner_bytes(fe, model.gated_mlp, lin, fused) + ROUTER_PROB_BYTES
    shared_ffn = shared_expert_ffn(model) * moe.num_shared_experts
    shared = _mlp_inner_bytes(shared_ffn / t, model.gated_mlp, lin, fused) if shared_ffn else 0.0
    router_input = b * h * rep
    e = moe.num_experts
    # fp32 router softmax, and its transposed copy; top-k indices; routing map; sorted indices.
    probs = ((2 * FP32_BYTES + ROUTING_MAP_BYTES) * e + TOPK_INDEX_BYTES * moe.top_k) * rep
    probs += SORTED_INDEX_BYTES * routed
    # Op-level checkpointing keeps the router GEMM's output; grouped expert GEMMs are not in
    # torchtitan's save list, so the experts are recomputed.
    op = b * moe.num_experts * rep
    working = b * routed * fe * gate + b * shared_ffn / t * gate
    act_out = routed * lin * fe  # the second expert GEMM's input, the activation's output
    return router_input, probs + routed * per_routed + shared, op, working, act_out, shared


@dataclass(frozen=True)
class _StageMemory:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    moe_buffers: float
    transient: float
    reallocated: float = 0.0  # gradient bytes the allocator hands out again every step
    step_transient: float = 0.0  # allocated at the optimizer step, after the activations

    @property
    def dynamic(self) -> float:
        """What is allocated and freed within a step (scaled by a profile's measured terms)."""
        return self.activations + self.logits + self.moe_buffers + self.transient


def _zero_shards(layout: Layout) -> tuple[int, int]:
    """How many ways dense and expert state are sharded by ZeRO: dp x cp and expert-dp, or
    the HSDP shard groups (Layout.zero_group)."""
    return layout.zero_group, layout.expert_zero_group


def _activation_parts(model: Model, job: Job, layout: Layout,
                      options: CostOptions) -> tuple[ActivationParts, ActivationParts]:
    """Per-token activations of a dense and of an MoE layer (the same on every stage)."""
    fp8 = job.precision == "fp8"
    return tuple(  # type: ignore[return-value]
        activation_bytes_per_token(model, layout, moe, flash_attention=options.flash_attention,
                                   seq_len=job.seq_len, fp8=fp8,
                                   moe_load_imbalance=options.routed_imbalance,
                                   fused_kernels=options.fused_kernels,
                                   fp4=options.fp4_gemms, compiled=options.compiled_layers)
        for moe in (False, True))


def loss_peak_bytes_per_entry(options: CostOptions, tp: int = 1) -> int:
    """Peak bytes per logit entry in the loss backward: compiled, fused (Megatron) or unfused
    (PyTorch), the unfused one under DTensor's loss_parallel when the logits are sharded over
    ``tp`` ranks (options.loss_parallel)."""
    if options.compiled_loss:
        return COMPILED_LOSS_PEAK_BYTES_PER_ENTRY
    if options.loss_parallel and tp > 1:
        return LOSS_PARALLEL_PEAK_BYTES_PER_ENTRY
    if options.fused_kernels and options.cross_entropy_impl == "te":
        return TE_LOSS_PEAK_BYTES_PER_ENTRY
    if options.cross_entropy_impl == "flash_attn":
        return FLASH_ATTN_LOSS_PEAK_BYTES_PER_ENTRY
    if options.fused_kernels:
        return FUSED_LOSS_PEAK_BYTES_PER_ENTRY
    return EAGER_LOSS_PEAK_BYTES_PER_ENTRY


def _sharded(params: StageParams, shards: tuple[int, int], zero: int, stage_from: int) -> float:
    """Parameters a rank holds of ``params``, for state that ZeRO (at the layout's effective
    stage ``zero``, over the dense and expert ``shards`` of ``_zero_shards``) shards from
    stage ``stage_from`` on."""
    if zero >= stage_from:
        return params.dense / shards[0] + params.expert / shards[1]
    return params.dense + params.expert


def _stage_state(model: Model, job: Job, layout: Layout, shape: StageShape,
                 options: CostOptions) -> tuple[StageParams, float, float, float]:
    """A stage's parameters and the weights, gradients and optimizer state its ranks keep for
    the whole step (before the DeepSpeed copies and the ZeRO-3 gathers ``_stage_memory`` adds):
    they read the degrees, ZeRO, schedule and stage shape, never the micro-batch, the
    recomputation or SP."""
    opt = job.optimizer
    params = stage_params(model, layout, shape)
    shards = _zero_shards(layout)
    zero = layout.effective_zero_stage  # ZeRO over a single rank changes nothing
    copies = parameter_copies(layout)  # DualPipe holds two stages' parameters per rank
    weight_bytes = sharded_weight_bytes(opt, options) if zero >= 3 else opt.param_bytes
    weights = copies * _sharded(params, shards, zero, 3) * weight_bytes
    gradients = copies * _sharded(params, shards, zero, 2) * opt.grad_bytes
    # BF16_Optimizer partitions its fp32 state over the data-parallel group at any stage
    stage_from = 0 if options.deepspeed_bf16_optimizer else 1
    optimizer = copies * _sharded(params, shards, zero, stage_from) * opt.sharded_state_bytes
    return params, weights, gradients, optimizer


def _stage_memory(model: Model, job: Job, layout: Layout, shape: StageShape,
                  options: CostOptions, acts: _Activations,
                  chunks: tuple[int, ...]) -> _StageMemory:
    """One stage's memory; ``chunks``: the layout's decoder layers per virtual stage
    (``Layout.pipeline_split``), which its in-flight activations count."""
    opt = job.optimizer
    params, weights, gradients, optimizer = _stage_state(model, job, layout, shape, options)
    dense_shard, expert_shard = _zero_shards(layout)
    zero = layout.effective_zero_stage
    copies = parameter_copies(layout)
    bf16_optimizer = options.deepspeed_bf16_optimizer
    reallocated = gradients if options.grads_reallocated else 0.0
    step_transient = 0.0
    if bf16_optimizer:  # options.py: the bf16 .grad beside the buffer, and the step's copies
        copy = copies * (params.dense + params.expert) * BF16_BYTES
        gradients += copy
        reallocated += copy
        step_transient = deepspeed_optimizer.bf16_step_bytes(
            copies * (params.dense + params.expert), copies * _sharded(
                params, (dense_shard, expert_shard), zero, 0), opt.grad_bytes)
    if options.deepspeed_fp16_optimizer:  # the step's fp32 gradient copies (options.py)
        step_transient = (copies * (params.dense + params.expert)
                          * deepspeed_optimizer.FP16_STEP_BYTES_PER_PARAM)

    m = layout.num_microbatches(job.global_batch_size)
    held = microbatches_in_flight(layout, shape.stage, m, chunks)
    activations, logits, moe_buffers = cached(
        _ACTIVATIONS, (acts, shape, held),
        lambda: _stage_activations(model, job, layout, shape, options, acts.parts, held))
    if options.pipeline_keeps_outputs and layout.pp > 1 and shape.last:
        # Every micro-batch's bf16 logits stay in the last stage's output_chunks through the
        # step's backward, and step() concatenates them at its end (options.py). One output is
        # added per backward of the last stage, which frees that micro-batch's activations: the
        # outputs count beyond the other in-flight micro-batches' activations they replace.
        outputs = m * layout.micro_batch_size * job.seq_len / layout.cp * (
            model.vocab_size / layout.tp) * BF16_BYTES
        one = cached(_ACTIVATIONS, (acts, shape, 1.0),
                     lambda: _stage_activations(model, job, layout, shape, options, acts.parts,
                                                1.0))[0]
        logits += max(0.0, outputs - (activations - one))
        step_transient = max(step_transient, 2 * outputs)
    transient = 0.0
    ends = (int(shape.first) + int(shape.last and not (model.tied_embeddings and shape.first)))
    body = params.total - ends * embedding_params(model) / layout.tp
    layer_params = max(0.0, body) / max(1, shape.layers)
    if zero >= 3 and layout.zero3_per_step:
        # FSDP2 under pipelining (torchtitan's default) keeps the stage unsharded for the whole
        # step and accumulates unsharded gradients between micro-batches in the reduce dtype
        # (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, to_accumulated_grad_if_needed
        # upcasts them; torchtitan reduces in fp32): the gradient dtype, not the weights'.
        # State over a shard group of one is outside FSDP (NeMo AutoModel's apply_fsdp passes
        # experts that EP alone shards as ignored_params): its one copy is counted above.
        gathered = (params.dense if dense_shard > 1 else 0.0) + (
            params.expert if expert_shard > 1 else 0.0)
        weights += copies * gathered * opt.param_bytes
        gradients += copies * gathered * opt.grad_bytes
    elif zero >= 3 and not layout.reshards_after_forward:
        # Gathered in the forward and kept for the backward: the stage's weights at once.
        transient = params.total * opt.param_bytes + layer_params * opt.grad_bytes
    elif zero >= 3:
        transient = _zero3_transient(model, layout, layer_params, job, options)
    elif zero == 2:
        transient = layer_params * opt.grad_bytes  # a layer's gradients before reduce-scatter
    return _StageMemory(weights, gradients, optimizer, activations, logits, moe_buffers,
                        transient, reallocated, step_transient)


@dataclass(frozen=True)
class _Activations:
    """A layout's per-token activations (``_activation_parts``) under the key of what they
    depend on: the model, the job but its global batch, the layout but its data-parallel
    fields (memo.DP_FIELDS), the options; it keys the stages' activations too."""

    key: tuple[object, ...]
    parts: tuple[ActivationParts, ActivationParts] = field(compare=False, hash=False)


_ACTIVATION_PARTS: dict[tuple[object, ...], _Activations] = new_cache()
_ACTIVATIONS: dict[tuple[_Activations, StageShape, float], tuple[float, float, float]] = (
    new_cache())


def _stage_activations(model: Model, job: Job, layout: Layout, shape: StageShape,
                       options: CostOptions, acts: tuple[ActivationParts, ActivationParts],
                       held: float) -> tuple[float, float, float]:
    """Activations, logits and MoE buffers of a stage holding ``held`` micro-batches in flight:
    none of it depends on data parallelism or ZeRO (memo.DP_FIELDS), so ``_stage_memory``
    caches it for the layouts that differ only there (a search's ZeRO stages, twice the
    nodes)."""
    tokens = layout.micro_batch_size * job.seq_len / layout.cp  # per GPU per micro-batch
    imbalance = options.routed_imbalance
    dense_act, moe_act = acts
    dense_layers = shape.layers - shape.moe_layers
    recompute, modules = layout.recompute, layout.recompute_modules
    redone = recomputed_fraction(layout, model.num_layers, shape.stage)

    def kept(act: ActivationParts) -> float:
        if recompute == "full" and redone < 1.0:  # block method: the rest keep everything
            return redone * act.kept("full") + (1.0 - redone) * act.kept("none")
        return act.kept(recompute, modules)

    # Every in-flight micro-batch keeps what its layers keep; on top, the layer running its
    # backward recomputes what was dropped and holds its gradient working set (measured with
    # PyTorch in tests/test_memory_pytorch.py).
    per_mb = (dense_layers * kept(dense_act) + shape.moe_layers * kept(moe_act)) * tokens
    worst = max((act.backward_peak(recompute if redone > 0 or recompute != "full" else "none",
                                   modules) for act, n in
                 ((dense_act, dense_layers), (moe_act, shape.moe_layers)) if n), default=0.0)
    offloaded = offloaded_layers(layout, shape.layers)
    if offloaded:  # on the host, but one layer's worth is in flight to or from it
        per_layer = per_mb / max(1, shape.layers)
        per_mb -= offloaded * per_layer
        worst += per_layer / tokens
    activations = per_mb * held + worst * tokens
    if shape.first:
        mask = model.hidden_size * layout.sp_replication
        per_token = EMBEDDING_ID_BYTES_PER_TOKEN + (mask if model.hidden_dropout > 0 else 0.0)
        activations += held * tokens * per_token
    logits = 0.0
    if shape.last:
        entry = loss_peak_bytes_per_entry(options, layout.tp)
        logits = tokens * model.vocab_size / layout.tp * entry
        # The loss backward ends, and frees its buffers, before the last layer's backward
        # starts: the stage peaks at the larger of the two above what is held, not at their
        # sum (measured with PyTorch's MemTracker on eager layers, the output layer and an
        # fp32 cross-entropy in every recompute mode: tests/test_memory_pytorch.py,
        # torch_blocks.stack_loss_peak_bytes). ``activations`` keeps the layer backward's part
        # beyond the loss peak, so the breakdown still sums to the peak.
        activations -= min(worst * tokens, logits)
    moe_buffers = 0.0
    if shape.moe_layers and model.moe is not None:
        routed = tokens * model.moe.top_k * layout.etp / layout.tp * imbalance
        moe_buffers = 2 * routed * model.hidden_size * BF16_BYTES  # dispatch + combine buffers
    return activations, logits, moe_buffers


def sharded_weight_bytes(opt: Optimizer, options: CostOptions) -> int:
    """Bytes per parameter of the weight shard ZeRO-3 keeps beside the optimizer state: none
    under PyTorch FSDP with an fp32 master copy, whose sharded parameter is that master
    (options.fsdp_sharded_master); else the working dtype's."""
    if options.fsdp_sharded_master and opt.master_param_bytes > 0:
        return 0
    return opt.param_bytes


def _zero3_transient(model: Model, layout: Layout, layer_params: float, job: Job,
                     options: CostOptions) -> float:
    """Unsharded parameters and gradients ZeRO-3 holds at once (no pipelining).

    FSDP gathers whole units: the current one and the prefetched next, plus one unit's
    gradients before their reduce-scatter. The embedding and the output layer are units of their
    own (torchtitan's ``fully_shard`` of ``tok_embeddings`` and of ``[norm, output]``), and with
    a large vocabulary the biggest: Llama-3-8B's 525M-parameter output layer against 218M per
    layer, the largest module DeepSpeed's ZeRO-3 estimator counts. DeepSpeed fetches per
    submodule: the largest weight in use plus what its live-parameter limit and prefetch bucket
    allow, and reduce-scatters gradients from a fixed bucket (options.py).
    """
    opt = job.optimizer
    limit = options.zero3_max_live_params
    if limit is None:
        unit = max(layer_params, embedding_params(model) / layout.tp)
        return (layer_params + unit) * opt.param_bytes + unit * opt.grad_bytes
    largest = largest_weight_params(model, layout)
    live = min(2 * layer_params, max(limit, largest) + DEEPSPEED_PREFETCH_BUCKET_PARAMS)
    grads = min(layer_params, DEEPSPEED_REDUCE_BUCKET_PARAMS)
    return live * opt.param_bytes + grads * opt.grad_bytes


def fragmentation_fraction(layout: Layout) -> float:
    """The caching allocator's fragmentation fraction for ``layout``: GMLake's recomputation
    figure when the backward recomputes activations (any recompute mode: GMLake measured
    per-layer checkpointing, the nearest strategy to selective and op-level recompute), else its
    no-strategy figure. Activation offloading is not a strategy GMLake measured (its offload is
    DeepSpeed's optimizer offload), so it keeps its recompute mode's fraction."""
    if layout.recompute == "none" or layout.recompute_layers == 0:
        return FRAGMENTATION_FRACTION_NO_RECOMPUTE
    return FRAGMENTATION_FRACTION_RECOMPUTE


def _fragmentation(dynamic_bytes: float, options: CostOptions, layout: Layout) -> float:
    """Reserved-but-unusable memory when ``dynamic_bytes`` are live (fraction f of reserved,
    fragmentation_fraction).

    With ``expandable_segments`` the caching allocator maps physical pages into one growing
    virtual segment on demand (the virtual-memory stitching GMLake measured removing the
    fragmentation), so no allowance is kept.
    """
    if options.expandable_segments:
        return 0.0
    fraction = fragmentation_fraction(layout)
    return dynamic_bytes * fraction / (1.0 - fraction)


def _peak_moment(mem: _StageMemory, scale: float, options: CostOptions,
                 layout: Layout) -> tuple[float, _StageMemory]:
    """(bytes, what is held) at the stage's peak: inside the backward, or at the optimizer step
    where its transients (``step_transient``) hold more. The step comes after the activations
    are freed, and the caching allocator returns its unused cached blocks to the driver before
    failing an allocation (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks), so no
    fragmentation allowance is added there."""
    dynamic = scale * mem.dynamic
    state = mem.weights + mem.gradients + mem.optimizer
    backward = state + dynamic + _fragmentation(dynamic + mem.reallocated, options, layout)
    step = state + mem.step_transient
    if step <= backward:
        return backward, mem
    return step, _StageMemory(mem.weights, mem.gradients + mem.step_transient, mem.optimizer,
                              0.0, 0.0, 0.0, 0.0)


def _communicators(layout: Layout, moe: bool) -> int:
    """Process groups a rank talks on (each holds NCCL buffers)."""
    sizes = [layout.tp, layout.pp, layout.dp_cp, layout.cp]
    if moe:
        sizes += [layout.ep, layout.etp, layout.expert_dp]
    return max(1, sum(1 for s in sizes if s > 1))


def capacity_bytes(cluster: Cluster, job: Job) -> int:
    """Usable memory per GPU: the smallest GPU of the cluster, less the job's headroom."""
    gpu = bounding_node_type(cluster).gpu
    return int(gpu.capacity_bytes * (1.0 - job.memory_headroom))


def deepspeed_engine_memory(job: Job, layout: Layout,
                            options: CostOptions) -> tuple[Job, CostOptions]:
    """The job and options as DeepSpeed's engine runs ``layout`` from placer's DeepSpeed config
    (options.deepspeed_engine): its optimizer wrapper's memory flags, and gradients in the
    accumulation dtype, bf16 (the file's ``data_types.grad_accum_dtype``; deepspeed_optimizer.py),
    which is also the dtype DeepSpeed reduces them in (step.estimate_with). The returned options are
    resolved (``deepspeed_engine`` off), so memory_estimate under estimate_with does not resolve
    them again."""
    wrapper = deepspeed_optimizer.placer_wrapper(layout.zero_stage, layout.pp)
    grad_bytes = deepspeed_optimizer.gradient_bytes(wrapper, "bf16")
    if grad_bytes != job.optimizer.grad_bytes:
        job = job.model_copy(update={"optimizer": job.optimizer.model_copy(
            update={"grad_bytes": grad_bytes})})
    return job, replace(options, deepspeed_engine=False,
                        **deepspeed_optimizer.memory_flags(wrapper))


_MEMORY: dict[tuple[object, ...], MemoryBreakdown] = new_cache()
_JOB_OPTIONS: dict[str, CostOptions] = new_cache()


def _own_options(job: Job) -> CostOptions:
    """The job's own options on its stack (``job_options``), cached on the job's text: the
    search asks for them at every memory check and state floor."""
    return cached(_JOB_OPTIONS, text_key(job), lambda: job_options(job))


def memory_estimate(model: Model, cluster: Cluster, job: Job, layout: Layout,
                    options: CostOptions | None = None,
                    profile: LinkProfile | None = None) -> MemoryBreakdown:
    """Peak memory of the worst pipeline stage (cheap: no topology, O(pp + layers)); options
    None: the job's own on its stack (stack_options.job_options). A profile's measured memory
    terms (``LinkProfile.memory``) scale the dynamic part and add their overhead.

    Cached under value keys (placer.cost.memo). The global batch enters only through the
    micro-batches in flight (``_stage_memory``), so the key holds the saturated micro-batch
    count (pipeline.saturated_microbatches) in its place: a search at another global batch
    finds most layouts here. Options None are the job's own (``job_options``), resolved before
    the key is made, so ``estimate`` (which passes them resolved) finds the search's memory
    checks of the same layout here."""
    if options is None:
        options = _own_options(job)
    m = saturated_microbatches(layout, layout.num_microbatches(job.global_batch_size))
    if options.pipeline_keeps_outputs and layout.pp > 1:
        m = layout.num_microbatches(job.global_batch_size)  # the last stage keeps all outputs
    key = (text_key(model), text_key(cluster), text_key(job, BATCH_FIELDS),
           layout_fields(layout), options, None if profile is None else text_key(profile), m)
    return cached(_MEMORY, key,
                  lambda: _memory_estimate(model, cluster, job, layout, options, profile))


def _resolved(job: Job, layout: Layout, options: CostOptions | None) -> tuple[Job, CostOptions]:
    """The job and options the memory model prices ``layout`` with: None is the job's own on its
    stack, and DeepSpeed's engine resolved (``deepspeed_engine_memory``)."""
    if options is None:
        options = _own_options(job)
    if options.deepspeed_engine:
        job, options = deepspeed_engine_memory(job, layout, options)
    return job, options


def _framework_bytes(model: Model, layout: Layout) -> int:
    return FRAMEWORK_BASE_BYTES + NCCL_BYTES_PER_COMMUNICATOR * _communicators(
        layout, model.moe is not None)


def state_floor_bytes(model: Model, job: Job, layout: Layout,
                      options: CostOptions | None = None,
                      profile: LinkProfile | None = None) -> float:
    """A lower bound on ``memory_estimate``'s ``total_bytes`` that reads no micro-batch,
    recomputation or SP (``_stage_state``): the largest stage's weights, gradients and optimizer
    state, plus the framework and a profile's overhead. The estimate adds the worst stage's
    peak moment (at least that stage's state, and at least every other stage's moment) to the
    same framework and overhead, each part rounded up; everything else it adds is >= 0. So a
    layout whose floor exceeds the capacity fits at no micro-batch, recomputation or SP
    (tests/test_solver_pruning.py)."""
    job, options = _resolved(job, layout, options)
    _, overhead = memory_terms(profile)
    seen: set[tuple[int, int, bool, bool]] = set()
    state = 0.0
    for shape in stage_shapes(model, layout):
        if shape.kind not in seen:
            seen.add(shape.kind)
            _, weights, gradients, optimizer = _stage_state(model, job, layout, shape, options)
            state = max(state, weights + gradients + optimizer)
    return state + _framework_bytes(model, layout) + overhead


def _memory_estimate(model: Model, cluster: Cluster, job: Job, layout: Layout,
                     options: CostOptions | None,
                     profile: LinkProfile | None) -> MemoryBreakdown:
    job, options = _resolved(job, layout, options)
    scale, overhead = memory_terms(profile)
    framework = _framework_bytes(model, layout)
    best: tuple[float, int, _StageMemory] | None = None
    key = (text_key(model), text_key(job, BATCH_FIELDS), layout_fields(layout, DP_FIELDS),
           options)
    acts = cached(_ACTIVATION_PARTS, key,
                  lambda: _Activations(key, _activation_parts(model, job, layout, options)))
    split = layout.pipeline_split(model.num_layers)
    looped = layout.vpp > 1 and not split.v_shape  # in flight counted chunk by chunk
    seen: set[tuple[tuple[int, int, bool, bool], tuple[int, ...]]] = set()  # StageShape.kind
    for shape in stage_shapes(model, layout):
        # Stages of the same shape (and, interleaved, the same layers per chunk) differ only
        # in the micro-batches they hold, which never grow with the stage index: the earliest
        # of each shape is its worst (O(shapes)).
        kind = (shape.kind, split.chunks[shape.stage::layout.pp] if looped else ())
        if kind in seen:
            continue
        seen.add(kind)
        total, mem = _peak_moment(_stage_memory(model, job, layout, shape, options, acts,
                                                split.chunks), scale, options, layout)
        if best is None or total > best[0]:
            best = (total, shape.stage, mem)
    assert best is not None
    _, stage, mem = best
    dynamic = scale * mem.dynamic
    parts = {
        "weights_bytes": math.ceil(mem.weights),
        "gradients_bytes": math.ceil(mem.gradients),
        "optimizer_bytes": math.ceil(mem.optimizer),
        "activations_bytes": math.ceil(scale * (mem.activations + mem.transient)),
        "logits_bytes": math.ceil(scale * mem.logits),
        "moe_buffers_bytes": math.ceil(scale * mem.moe_buffers),
        "framework_bytes": framework,
        "fragmentation_bytes": math.ceil(_fragmentation(dynamic + mem.reallocated, options,
                                                        layout)),
        "overhead_bytes": overhead,
    }
    return MemoryBreakdown(**parts, total_bytes=sum(parts.values()),
                           capacity_bytes=capacity_bytes(cluster, job), worst_stage=stage)


def training_state_bytes(model: Model, job: Job) -> int:
    """Weights, gradients and optimizer state of the whole model (what ZeRO-3 can shard), with
    the gradient bytes DeepSpeed's ZeRO-3 accumulates in on a DeepSpeed stack and the weight
    shard the stack keeps (sharded_weight_bytes)."""
    opt = job.optimizer
    options = job_options(job)
    if options.deepspeed_engine:
        opt = deepspeed_engine_memory(job, Layout(zero_stage=3), options)[0].optimizer
    per_param = sharded_weight_bytes(opt, options) + opt.grad_bytes + opt.sharded_state_bytes
    return total_params(model) * per_param


@dataclass(frozen=True)
class MinimumGpus:
    """The fewest GPUs that can hold the training state even fully sharded, and why."""

    gpus: int
    state_bytes: int
    per_gpu_bytes: int
    reason: str


def minimum_gpus_needed(model: Model, cluster: Cluster, job: Job) -> MinimumGpus:
    """Lower bound on GPUs: full ZeRO-3 sharding of weights, gradients and optimizer state.

    Activations, buffers and overheads only add to it, so fewer GPUs can never fit.
    """
    state = training_state_bytes(model, job)
    usable = capacity_bytes(cluster, job) - FRAMEWORK_BASE_BYTES
    per_gpu = max(1, usable)
    gpus = max(1, math.ceil(state / per_gpu))
    have = cluster.num_gpus
    gpu_bytes = bounding_node_type(cluster).gpu.capacity_bytes
    reason = (f"weights and optimizer state need {_tb(state)}; {have} x {_gib(gpu_bytes)} = "
              f"{_tb(have * gpu_bytes)} even fully sharded; at least {gpus} GPUs are needed")
    return MinimumGpus(gpus=gpus, state_bytes=state, per_gpu_bytes=per_gpu, reason=reason)


def _tb(value: float) -> str:
    return f"{value / 1e12:.1f} TB"


def _gib(value: float) -> str:
    return f"{value / 2**30:.0f} GiB"
