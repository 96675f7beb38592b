"""FLOPs and compute time of forward, backward and recomputation, per layer and per step.

FLOPs count a matrix product of (m x k)(k x n) as 2mkn. Two conventions are kept apart:

* *model FLOPs* (for MFU and ``tflops_per_gpu``): forward + backward = 3 x forward, attention
  over the full (non-causal) s x s square, as in Narayanan et al. 2021 and PaLM's MFU; no
  recomputation. For GPT shapes this is ``72 B s l h^2 (1 + s/6h + V/12lh)`` (docs/sources.md 9.3).
* *executed work* (for time): causal attention does half the score blocks, fused attention's
  backward costs 2.5x its forward (FlashAttention-2, Dao 2023, section 3.1: five matmuls against
  two), and recomputation repeats forward work.

A GEMM is priced from its shape (M rows, N columns, K depth; ``gemm_seconds``): its FLOPs at the
GPU's maximum achievable matmul rate (a microbenchmark per GPU, profile.MAMF_EFFICIENCY) times
the fraction of the last wave of output tiles that does useful work on the GPU's SMs (tile and
wave quantization, NVIDIA's "Matrix Multiplication Background" guide), bounded below by the
bytes it reads and writes at HBM bandwidth (a roofline), plus a fixed time per GEMM kernel
(``F_half / (peak x max_efficiency)``, the same at FP8). The small per-rank shapes TP, CP and EP
create fall off the curve through all three.
Element-wise kernels are memory bound: their traffic is proportional to the activations a layer
stores, moved at HBM bandwidth. Mixture-of-experts layers add the token dispatcher's own memory
passes (permute, sort by expert, unpermute, router softmax/top-k), charged at HBM bandwidth, plus
a fitted time per routed token copy for the dispatcher's bookkeeping, and run each local expert as
its own GEMM problem of ``tokens_per_expert`` rows launched as a group (``expert_gemm_group``):
Transformer Engine's GroupedLinear issues one cuBLAS GEMM per expert round-robin on 4 compute
streams, so up to 4 experts' output tiles share the SMs' waves and one fixed kernel time when
their grids leave SMs free (``concurrent_gemms``; a GEMM that fills every SM runs alone);
torch._grouped_mm (torchtitan) runs every local expert in one kernel. An MoE layer also waits for
the host to launch its kernels (``moe_host_launch_s``). The output layer runs in
BF16 even in FP8 recipes (step.py).
Constants: placer/cost/profile.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from placer.cost.memo import BATCH_FIELDS, cached, constants_key, new_cache, text_key
from placer.cost.memory import LOGITS_BYTES_PER_ENTRY, activation_bytes_per_token
from placer.cost.options import DEFAULT_OPTIONS, CostOptions
from placer.cost.params import (
    active_expert_params,
    attention_projection_params,
    dense_mlp_params,
    embedding_params,
    mla_projections,
    mlp_matrices,
    num_moe_layers,
    router_params,
    shared_expert_ffn,
    shared_expert_params,
)
from placer.cost.profile import HBM_EFFICIENCY, HOPPER_CLASS_FAMILIES, Calibration, constant_family
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model

# Activations move in bf16 (FP8 recipes quantise only the GEMM inputs).
ACTIVATION_BYTES = 2
# FlashAttention-2's throughput on Hopper relative to the Hopper-specific kernels (cuDNN's fused
# attention, FlashAttention-3) that the fitted attention efficiency describes: FA2 reaches 35 % of
# H100's BF16 peak where FA3 reaches 75 % (Shah et al. 2024, FlashAttention-3,
# arXiv:2407.08608, section 1). One H100 measurement of one shape puts it at 329.483 / 631.338
# (pytorch/pytorch#142132); priced so, the leave-one-source-out mean is 10.0 % against 9.1 %
# (docs/sources.md 12). Applied on Hopper and later (profile.HOPPER_CLASS_FAMILIES): before
# Hopper there is no faster kernel (FA3 uses Hopper's TMA and warpgroup MMA), so there the fitted
# attention efficiency is FlashAttention-2's own.
FA2_RELATIVE_THROUGHPUT = 0.35 / 0.75
# FlashAttention-2 backward: 5 matmuls against 2 in the forward pass (Dao 2023, arXiv:2307.08691).
ATTENTION_BACKWARD_RATIO = 2.5
# Fused-attention throughput by head dimension, relative to the 128 the fitted attention
# efficiency describes (every fused row of the calibration set but GPT-OSS's has d = 128, or
# DeepSeek-V3's MLA 192/128). cuDNN's own forward measurements, 64 query / 8 KV heads, causal,
# BF16, the same cuDNN on each GPU (NVIDIA/cudnn-frontend benchmark/attention_inference/results,
# cudnn 9.27.0: gpt_oss/<gpu>/gpt_oss_20260928_*.csv "gpt_oss_full" d 64 against
# prefill_sweep/<gpu>/prefill_sweep_20260928_*.csv "llama3.1" d 128; docs/sources.md 12):
# H200 348 / 490 TFLOP/s at 2,048 tokens, 457 / 654 at 8,192 (0.71, 0.70); GB200 668 / 956 and
# 995 / 1,438 (0.70, 0.69). Head dimension 64 halves the work per loaded K/V tile while the
# softmax and the per-tile bookkeeping stay. MLA's 192/128 runs at d 128's rate on GB200
# (sdpa_benchmark_training/results/gb200_919_only_cudnn: dsv3 1,350 / 1,108 against llama3.1
# 1,335 / 1,132 forward / backward at 4,096 tokens), so from 128 up the factor is 1. Between the
# points it is linear in log2(d); below 64 it stays 0.70 (no measurement). The backward takes the
# forward's ratio (cuDNN publishes no d 64 backward without a sliding window). Applied on the
# families measured, Hopper and Blackwell (profile.HOPPER_CLASS_FAMILIES); elsewhere (A100's
# FlashAttention-2, CPUs, unmeasured parts) the head dimension does not change the rate.
ATTENTION_HEAD_DIM_RELATIVE = ((64, 0.70), (128, 1.0))
# Token dispatcher passes of one MoE layer's forward over the routed tokens (routed x h, activation
# dtype), from Megatron-Core's MoEAlltoAllTokenDispatcher (moe/token_dispatcher.py: "permute ->
# A2A(EP) -> AG(TP) -> sort_chunk(if num_local_experts>1)" and the reverse "sort_chunk -> RS(TP)
# -> A2A(EP) -> unpermute"): permute reads and writes them (2), unpermute reads them (1); sorting
# the received chunks by local expert and back reads and writes them twice more (4) when a rank
# holds several experts. The backward runs the same permutations on the gradients.
MOE_PERMUTE_PASSES = 3
MOE_SORT_PASSES = 4
# Router: softmax and top-k over fp32 logits (tokens x experts): one write by the router GEMM
# counted with it, then a read and write by the softmax and a read by the top-k.
MOE_ROUTER_PASSES = 3
ROUTER_LOGIT_BYTES = 4
# Adam step per sharded parameter: read+write fp32 master, m and v (24 B), read the fp32 gradient
# (4 B), write the bf16 weight (2 B) -- the bf16 recipe of docs/sources.md 9.1.
OPTIMIZER_BYTES_PER_PARAM = 30
# Megatron-Core's TEGroupedMLP (megatron/core/transformer/moe/experts.py, the same from
# core_v0.15.0 to core_v0.19.0) runs two steps around the grouped GEMMs as eager PyTorch ops on
# every routed token copy: a clamped GLU (activation_func_clamp_value) chunks the fc1 output,
# clamps both halves and concatenates them before the fused activation
# (fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl), and the fc2 bias, which the grouped
# linear returns unapplied (skip_bias_add=True), is scaled by the routing probability, added to
# each expert's rows and the rows concatenated (TEGroupedMLP._apply_bias). HBM bytes per routed
# copy, per expert-FFN column (clamp) and per hidden column (bias), bf16: what the aten ops of
# those steps read and write (views free), counted by tests/test_cost_expert_eager.py on the ops
# themselves. Forward, and backward (autograd of the same ops: the clamps' masks and selects,
# the bias and probability gradients).
EAGER_CLAMP_FORWARD_BYTES = 16
EAGER_CLAMP_BACKWARD_BYTES = 27
EAGER_BIAS_FORWARD_BYTES = 12
EAGER_BIAS_BACKWARD_BYTES = 16


@dataclass(frozen=True)
class LayerWork:
    """Forward work of one layer (or the output layer) for one micro-batch on one GPU."""

    gemms: tuple[tuple[float, int], ...]  # (FLOPs of one GEMM, how many of them)
    attention_flops: float  # fused attention, executed FLOPs (0 when attention is unfused)
    elementwise_bytes: float  # stored activation bytes: the scale of element-wise traffic
    score_bytes: float = 0.0  # unfused attention's s x s scores, softmax and dropout
    attention_gemms: tuple[tuple[float, int], ...] = ()  # unfused attention's batched GEMMs
    dispatch_bytes: float = 0.0  # MoE token dispatcher and router traffic (forward)
    routed_tokens: float = 0.0  # token copies this GPU's experts take (MoE layers)
    module_bytes: tuple[tuple[str, float], ...] = ()  # what each recompute module releases
    shared_gemms: int = 0  # trailing entries of ``gemms`` that are the shared experts'
    # (M, N, K) of one GEMM of each ``gemms`` / ``attention_gemms`` entry (a batched GEMM's
    # batch is its FLOPs over 2MNK); empty: priced by FLOPs alone, as one full-wave GEMM.
    gemm_shapes: tuple[tuple[float, float, float], ...] = ()
    # How many GEMMs of each ``gemms`` entry run at once, sharing the SMs' waves and one fixed
    # kernel time (expert_gemm_group); empty: one at a time.
    gemm_groups: tuple[int, ...] = ()
    # Local experts whose kernels the host launches in each pass (0: none, or a CUDA-graphed
    # iteration): what the host-bound launch time of an MoE layer scales with (pass_times).
    launched_experts: int = 0
    host_launched: bool = False  # an MoE layer whose kernels the host launches each pass
    gemm_one_kernel: bool = False  # gemm_groups are one grouped kernel, not concurrent streams
    attention_shapes: tuple[tuple[float, float, float], ...] = ()
    attention_keys: float = 0.0  # keys per query in one fused-attention kernel call
    attention_kernel: str = "cudnn"  # which fused-attention kernel runs (CostOptions)
    attention_head_dim: int = 128  # Q/K head dimension of the fused kernel (head_dim_efficiency)
    # HBM bytes of the eager expert clamp and bias ops (eager_expert_bytes): forward, backward,
    # and what recomputing moe_act repeats.
    eager_expert_bytes: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def gemm_flops(self) -> float:
        return sum(f * n for f, n in self.gemms)


def tokens_per_gpu(job: Job, layout: Layout) -> float:
    """Tokens of one micro-batch that each GPU of a TP group works on (before TP splits)."""
    return layout.micro_batch_size * job.seq_len / layout.cp


LAYER_FIELDS = ("tp", "cp", "ep", "etp", "micro_batch_size", "sequence_parallel")
"""The layout fields ``layer_work`` reads (directly and through tokens_per_gpu,
kv_heads_per_gpu, sp_replication, activation_bytes_per_token, _mla_gemms and
moe_dispatch_bytes): its cache key (tests/test_cost_memo.py checks the others change nothing)."""
DENSE_LAYER_FIELDS = ("tp", "cp", "micro_batch_size", "sequence_parallel")
"""The fields a dense layer's ``layer_work`` reads: ``LAYER_FIELDS`` but the expert degrees,
which only an MoE layer's router, experts and dispatch read, so the dense layers of an MoE model
are computed once for all its (ep, etp) splits (tests/test_cost_memo.py)."""
_LAYER_WORK: dict[tuple[object, ...], LayerWork] = new_cache()
_PASS_TIMES: dict[tuple[object, ...], PassTimes] = new_cache()


def layer_work(model: Model, job: Job, layout: Layout, moe_layer: bool,
               options: CostOptions = DEFAULT_OPTIONS) -> LayerWork:
    """GEMMs, attention and element-wise traffic of one transformer layer on one GPU; cached
    under value keys (placer.cost.memo): a search and its compute floors (placer.cost.bound)
    ask for the same layer for every pipeline depth, ZeRO stage and recomputation."""
    fields = LAYER_FIELDS if moe_layer and model.moe is not None else DENSE_LAYER_FIELDS
    key = (text_key(model), text_key(job, BATCH_FIELDS),
           tuple(getattr(layout, name) for name in fields), moe_layer, options)
    return cached(_LAYER_WORK, key, lambda: _layer_work(model, job, layout, moe_layer, options))


def _layer_work(model: Model, job: Job, layout: Layout, moe_layer: bool,
                options: CostOptions) -> LayerWork:
    h, d, a = model.hidden_size, model.attention_head_dim, model.num_attention_heads
    t = layout.tp
    tokens = tokens_per_gpu(job, layout)
    imbalance = options.routed_imbalance
    kv_local = layout.kv_heads_per_gpu(model.kv_heads)
    gate = mlp_matrices(model) - 1  # 2 for gated (gate and up fused), 1 otherwise
    gemms: list[tuple[float, int]] = [
        (2 * tokens * h * d * (a / t + 2 * kv_local), 1),  # QKV projection
        (2 * tokens * a * d * h / t, 1),  # output projection
    ]
    shapes: list[tuple[float, float, float]] = [
        (tokens, d * (a / t + 2 * kv_local), h), (tokens, h, a * d / t)]
    if model.mla is not None:
        gemms, shapes = _mla_gemms(model, layout, tokens)
    dv = model.value_head_dim
    score_bytes, keys = 0.0, 0.0
    attention_gemms: tuple[tuple[float, int], ...] = ()
    attention_shapes: tuple[tuple[float, float, float], ...] = ()
    if options.flash_attention:
        # Causal: each query attends on average to half of the full sequence (CP included), or
        # to at most the window in sliding-window layers (averaged over the model's layers).
        attended = attended_keys_per_query(model, job.seq_len)
        attention = 2 * tokens * a * (d + dv) * attended / t  # Q K^T (width d), P V (dv)
        # Ring attention (CP) runs cp kernel calls per layer, each over 1/cp of the keys.
        keys = attended / layout.cp
    else:
        # Unfused: Q K^T and scores x V are batched GEMMs over the whole s x s square.
        attention = 0.0
        attention_gemms = ((2 * tokens * a * d * job.seq_len / t, 2),)
        # Per head: Q K^T is (s x d)(d x s), scores x V is (s x s)(s x d); one shape for both.
        attention_shapes = ((float(job.seq_len), float(job.seq_len), float(d)),)
        if dv != d:  # MLA: scores x V is (s x s)(s x dv)
            attention_gemms = ((2 * tokens * a * d * job.seq_len / t, 1),
                               (2 * tokens * a * dv * job.seq_len / t, 1))
            attention_shapes = ((float(job.seq_len), float(job.seq_len), float(d)),
                                (float(job.seq_len), float(dv), float(job.seq_len)))
        score_bytes = 5 * a * job.seq_len / t * tokens  # Korthikanti's 5as^2b, per GPU
    dispatch, routed = 0.0, 0.0
    eager = (0.0, 0.0, 0.0)
    groups: list[int] = []
    launched = 0
    if moe_layer and model.moe is not None:
        moe = model.moe
        rep = layout.sp_replication
        gemms.append((2 * tokens * h * moe.num_experts * rep, 1))  # router
        shapes.append((tokens * rep, moe.num_experts, h))
        local_experts = moe.num_experts / layout.ep
        routed = tokens * moe.top_k * layout.etp / t * imbalance
        # Each local expert is its own GEMM problem of tokens_per_expert rows (routed tokens of
        # the whole EP group shared by its experts), launched as a group (expert_gemm_group).
        per_expert = routed / local_experts
        fe = moe.expert_ffn_hidden_size / layout.etp
        count = max(1, round(local_experts))
        group = expert_gemm_group(count, options)
        launched = 0 if options.cuda_graphs else count
        groups = [1] * len(gemms) + [group, group]
        gemms.append((2 * per_expert * h * fe * gate, count))
        gemms.append((2 * per_expert * fe * h, count))
        shapes += [(per_expert, fe * gate, h), (per_expert, h, fe)]
        dispatch = moe_dispatch_bytes(model, layout, tokens, routed)
        eager = eager_expert_bytes(model, fe, routed, options)
        if moe.num_shared_experts:
            fs = shared_expert_ffn(model) * moe.num_shared_experts
            gemms.append((2 * tokens * h * fs * gate / t, 1))
            gemms.append((2 * tokens * fs * h / t, 1))
            shapes += [(tokens, fs * gate / t, h), (tokens, h, fs / t)]
    else:
        ffn = model.ffn_hidden_size
        gemms.append((2 * tokens * h * ffn * gate / t, 1))
        gemms.append((2 * tokens * ffn * h / t, 1))
        shapes += [(tokens, ffn * gate / t, h), (tokens, h, ffn / t)]
    # Element-wise traffic scales with what the layer's kernels store: eager PyTorch modules
    # (torchtitan without torch.compile) run each norm, activation and rotary op as its own
    # kernel and store their eager tensors (memory.activation_bytes_per_token with
    # fused_kernels False); a compiled block's pointwise chains are fused by Inductor, priced as
    # fused kernels.
    stored = activation_bytes_per_token(
        model, layout, moe_layer, moe_load_imbalance=imbalance,
        fused_kernels=options.fused_kernels or options.compiled_layers)
    shared = 2 if moe_layer and model.moe is not None and model.moe.num_shared_experts else 0
    return LayerWork(gemms=tuple(gemms), attention_flops=attention,
                     elementwise_bytes=stored.total * tokens, score_bytes=score_bytes,
                     attention_gemms=attention_gemms, dispatch_bytes=dispatch,
                     routed_tokens=routed,
                     module_bytes=tuple((n, b * tokens) for n, b in stored.modules),
                     shared_gemms=shared, attention_keys=keys,
                     attention_kernel=options.attention_kernel, attention_head_dim=d,
                     gemm_shapes=tuple(shapes),
                     gemm_groups=tuple(groups + [1] * (len(gemms) - len(groups))),
                     launched_experts=launched, host_launched=launched > 0,
                     gemm_one_kernel=options.moe_grouped_kernel == "single",
                     attention_shapes=attention_shapes, eager_expert_bytes=eager)


def eager_expert_bytes(model: Model, expert_ffn: float, routed: float,
                       options: CostOptions) -> tuple[float, float, float]:
    """HBM bytes of Megatron-Core TEGroupedMLP's eager clamp and fc2-bias steps on ``routed``
    token copies of experts ``expert_ffn`` wide (per GPU, after ETP): (forward, backward, what
    recomputing ``moe_act`` repeats: the clamp, which runs inside the checkpointed activation).
    Zeros unless ``options.moe_eager_expert_ops``; the clamp part needs a clamped gated MLP
    (Model.activation_clamp), the bias part linear biases (Model.linear_bias)."""
    if not options.moe_eager_expert_ops or model.moe is None:
        return 0.0, 0.0, 0.0
    clamp = expert_ffn if model.activation_clamp is not None and model.gated_mlp else 0.0
    bias = float(model.hidden_size) if model.linear_bias else 0.0
    forward = EAGER_CLAMP_FORWARD_BYTES * clamp + EAGER_BIAS_FORWARD_BYTES * bias
    backward = EAGER_CLAMP_BACKWARD_BYTES * clamp + EAGER_BIAS_BACKWARD_BYTES * bias
    return routed * forward, routed * backward, routed * EAGER_CLAMP_FORWARD_BYTES * clamp


# Compute streams Transformer Engine's GroupedLinear spreads its per-expert GEMMs over:
# multi_stream_cublas_gemm issues one cuBLAS GEMM per expert on stream ``i % num_streams``, with
# ``num_compute_streams = 4`` (NVIDIA/TransformerEngine v2.9-v2.13,
# transformer_engine/common/gemm/cublaslt_gemm.cu and common/util/multi_stream.cpp; its CUTLASS
# grouped GEMM runs only on Hopper with NVTE_USE_CUTLASS_GROUPED_GEMM=1, off by default).
TE_GROUPED_GEMM_STREAMS = 4


def expert_gemm_group(local_experts: int, options: CostOptions) -> int:
    """How many local experts' GEMMs run at once: every one in a single grouped kernel
    (``moe_grouped_kernel="single"``: torch._grouped_mm, a CUTLASS grouped kernel), Transformer
    Engine's 4 streams (``"te_streams"``), or one at a time without a grouped GEMM (Megatron's
    SequentialMLP, a loop over the local experts)."""
    if not options.moe_grouped_gemm:
        return 1
    if options.moe_grouped_kernel == "single":
        return local_experts
    return min(local_experts, TE_GROUPED_GEMM_STREAMS)


def _mla_gemms(model: Model, layout: Layout, tokens: float
               ) -> tuple[list[tuple[float, int]], list[tuple[float, float, float]]]:
    """Latent attention's projections on one GPU, split as megatron-core 0.16.1 does
    (multi_latent_attention.py, MLASelfAttention): the down projections are TELinear
    ``parallel_mode='duplicated'`` (whole weight on every TP rank, run on the rank's own
    sequence-parallel tokens), the up projections (and the plain query projection)
    column-parallel, the output projection row-parallel."""
    t, rep = layout.tp, layout.sp_replication
    gemms: list[tuple[float, int]] = []
    shapes: list[tuple[float, float, float]] = []
    for name, k, n in mla_projections(model):
        if name.endswith("down_proj"):
            m, n_local, k_local = tokens * rep, float(n), float(k)
        elif name == "proj":
            m, n_local, k_local = tokens, float(n), k / t
        else:
            m, n_local, k_local = tokens, n / t, float(k)
        gemms.append((2 * m * n_local * k_local, 1))
        shapes.append((m, n_local, k_local))
    return gemms, shapes


def attended_keys_per_query(model: Model, seq_len: int, causal: bool = True) -> float:
    """Keys one query attends to, averaged over positions and over the model's layers.

    Causal attention over ``s`` tokens sees ``s/2`` keys on average; a sliding window of ``w``
    keys sees ``w - w^2/(2s)`` (``min(i+1, w)`` averaged over positions ``i``; equal to ``s/2`` at
    ``w = s``), and FlashAttention skips the blocks outside the window. The non-causal count
    (model FLOPs) is ``s``, or ``min(w, s)`` in a sliding-window layer.
    """
    window = min(model.sliding_window or seq_len, seq_len)
    if causal:
        full, local = seq_len / 2, window - window * window / (2 * seq_len)
    else:
        full, local = float(seq_len), float(window)
    sliding = model.num_sliding_window_layers
    return (full * (model.num_layers - sliding) + local * sliding) / model.num_layers


def moe_dispatch_bytes(model: Model, layout: Layout, tokens: float, routed: float) -> float:
    """Forward HBM traffic of an MoE layer's router and token dispatcher on one GPU.

    ``routed`` token copies of ``h`` activations are permuted, sorted by local expert when the
    rank holds several, sorted back and unpermuted; unpermute also writes the ``tokens`` outputs
    (MOE_PERMUTE_PASSES, MOE_SORT_PASSES). The router's softmax and top-k pass over fp32 logits.
    """
    moe = model.moe
    assert moe is not None
    h = model.hidden_size
    rep = layout.sp_replication
    passes = MOE_PERMUTE_PASSES + (MOE_SORT_PASSES if moe.num_experts > layout.ep else 0)
    tokens_local = tokens * rep
    permutes = (passes * routed + tokens_local) * h * ACTIVATION_BYTES
    router = MOE_ROUTER_PASSES * tokens_local * moe.num_experts * ROUTER_LOGIT_BYTES
    return permutes + router


def logits_work(model: Model, job: Job, layout: Layout) -> LayerWork:
    """The output layer and loss on the last stage (vocabulary split over TP)."""
    tokens = tokens_per_gpu(job, layout)
    v_local = model.vocab_size / layout.tp
    return LayerWork(gemms=((2 * tokens * model.hidden_size * v_local, 1),), attention_flops=0.0,
                     elementwise_bytes=tokens * v_local * LOGITS_BYTES_PER_ENTRY,
                     gemm_shapes=((tokens, v_local, float(model.hidden_size)),))


@dataclass(frozen=True)
class PassTimes:
    """Seconds of forward, backward and recomputation of some work on one GPU.

    ``gemm_s`` is the part of the three spent in GEMMs (what TP overlap can hide behind).
    """

    forward_s: float
    backward_s: float
    recompute_s: float
    gemm_s: float = 0.0

    def __add__(self, other: PassTimes) -> PassTimes:
        return PassTimes(self.forward_s + other.forward_s, self.backward_s + other.backward_s,
                         self.recompute_s + other.recompute_s, self.gemm_s + other.gemm_s)

    def scaled(self, factor: float) -> PassTimes:
        return PassTimes(self.forward_s * factor, self.backward_s * factor,
                         self.recompute_s * factor, self.gemm_s * factor)

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s


ZERO_TIMES = PassTimes(0.0, 0.0, 0.0)


def gemm_time(flops: float, peak: float, efficiency: float, half_flops: float) -> float:
    """One GEMM by FLOPs alone: efficiency ``max x F / (F + F_half)`` of the peak."""
    return (flops + half_flops) / (peak * efficiency)


# Output tiles of the cuBLAS / CUTLASS kernels that run Tensor Cores at full rate: NVIDIA's Deep
# Learning Performance guide, "Matrix Multiplication Background" (tile quantization: 256x128,
# 128x256 and 128x128 tiles; a GEMM's output is covered by whole tiles, one thread block each).
GEMM_TILES = ((256, 128), (128, 256), (128, 128))
# A GEMM with fewer output tiles than SMs splits its reduction (split-K, as cuBLAS's heuristics
# do for small outputs) into slices of at least this depth, so idle SMs get work.
SPLIT_K_MIN_DEPTH = 512
# GEMM operands and output bytes: BF16 in and out; FP8 recipes quantise the inputs to 1 byte.
GEMM_OUTPUT_BYTES = 2
# NVFP4 operands: a 4-bit E2M1 value per element plus one FP8 E4M3 scale per 16-element block
# (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025).
NVFP4_OPERAND_BYTES = 0.5 + 1 / 16
# MXFP8 operands: an E4M3 byte per element plus one E8M0 scale byte per 32-element block
# (NVIDIA/TransformerEngine@41f6cbf docs/features/low_precision_training/mxfp8/mxfp8.rst,
# "Data Format").
MXFP8_OPERAND_BYTES = 1.0 + 1 / 32
OPERAND_BYTES = {"fp8": 1.0, "mxfp8": MXFP8_OPERAND_BYTES, "fp4": NVFP4_OPERAND_BYTES}


def linear_precision(job: Job, options: CostOptions) -> str:
    """The precision the linear layers' GEMMs run in: NVFP4 under an NVFP4 recipe
    (``CostOptions.fp4_gemms``), MXFP8 under an MXFP8 one (``CostOptions.mxfp8_gemms``), else
    the job's. MFU stays of the job's precision's peak."""
    if job.precision != "fp8":
        return job.precision
    if options.fp4_gemms:
        return "fp4"
    return "mxfp8" if options.mxfp8_gemms else job.precision


@lru_cache(maxsize=65536)
def wave_efficiency(m: float, n: float, k: float, sms: int, group: int = 1) -> float:
    """Useful fraction of the thread-block slots a GEMM occupies: ``m x n`` of output over
    whole tiles (tile quantization) scheduled ``sms`` at a time (wave quantization: the last
    wave runs as long as a full one), the best of the kernels' tile shapes (GEMM_TILES).
    ``group`` equal GEMMs running at once (a grouped GEMM, or concurrent streams) pool their
    tiles into the same waves."""
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = group * math.ceil(m / tm) * math.ceil(n / tn)
        split = 1
        if tiles < sms:
            split = max(1, min(sms // tiles, int(k // SPLIT_K_MIN_DEPTH)))
        waves = math.ceil(tiles * split / sms)
        best = max(best, group * m * n * split / (waves * sms * tm * tn))
    return min(1.0, best)


def concurrent_gemms(m: float, n: float, sms: int) -> int:
    """How many equal GEMMs on separate streams can run side by side: as many as leave each its
    thread blocks on the SMs at once (the smallest tiles, GEMM_TILES); a GEMM whose grid fills
    every SM keeps the next one waiting until its blocks retire, so such GEMMs run one after
    another, each paying its own fixed time."""
    tm, tn = GEMM_TILES[-1]
    return max(1, sms // (math.ceil(m / tm) * math.ceil(n / tn)))


def gemm_times(gemms: tuple[tuple[float, int], ...],
               shapes: tuple[tuple[float, float, float], ...], calib: Calibration,
               precision: str, groups: tuple[int, ...] = (),
               one_kernel: bool = False) -> list[float]:
    """Seconds of each ``(FLOPs, count)`` entry, all ``count`` GEMMs of it (``gemm_seconds``).

    ``groups[i]`` of entry i's GEMMs run at once (LayerWork.gemm_groups): the count runs in
    rounds of that many, each round's tiles sharing the waves, each round paying the fixed
    kernel time once (the last round holds the remainder). On separate streams no more run at
    once than leave each its thread blocks on the SMs (``concurrent_gemms``); ``one_kernel``:
    a grouped kernel, whose one grid holds them all."""
    peak, eff = calib.peak_flops(precision), calib.gemm_efficiency(precision)
    fixed_s = calib.half_efficiency_flops(precision) / (peak * eff)
    if len(shapes) != len(gemms):
        return [n * (f / (peak * eff) + fixed_s) for f, n in gemms]
    operand = OPERAND_BYTES.get(precision, 2.0) if calib.peak_fp8_flops is not None else 2.0
    if precision == "fp4" and calib.peak_fp4_flops is None:
        operand = 1.0  # no FP4 tensor cores: the GEMM runs in FP8 (Calibration.peak_flops)
    bandwidth = calib.hbm_bytes_per_s * HBM_EFFICIENCY
    if len(groups) != len(gemms):
        groups = (1,) * len(gemms)
    times = []
    for (flops, count), (m, n, k), group in zip(gemms, shapes, groups, strict=True):
        if flops <= 0 or min(m, n, k) <= 0:
            times.append(0.0)
            continue
        batch = flops / (2 * m * n * k)
        moved = batch * (operand * (m * k + k * n) + GEMM_OUTPUT_BYTES * m * n)
        if not one_kernel:
            group = min(group, concurrent_gemms(m, n, calib.sm_count))
        group = max(1, min(group, count))
        full, rest = divmod(count, group)
        total = 0.0
        for rounds, size in ((full, group), (1 if rest else 0, rest)):
            if rounds:
                waves = wave_efficiency(m, n, k, calib.sm_count, size)
                compute = size * flops / (peak * eff * waves)
                total += rounds * (max(compute, size * moved / bandwidth) + fixed_s)
        times.append(total)
    return times


def attention_forward_s(work: LayerWork, calib: Calibration) -> float:
    """Forward time of a layer's core attention: fused, or unfused batched GEMMs (BF16)."""
    gemm = calib.gemm
    half = gemm.half_efficiency_flops or 0.0
    bf16_peak = calib.peak_bf16_flops
    unfused = sum(gemm_times(work.attention_gemms, work.attention_shapes, calib, "bf16"))
    fused = 0.0
    if work.attention_flops:
        efficiency = gemm.attention_efficiency or calib.gemm_efficiency("bf16")
        if constant_family(calib.gpu) in HOPPER_CLASS_FAMILIES:  # where cuDNN measured it
            efficiency *= head_dim_efficiency(work.attention_head_dim)
            if work.attention_kernel in ("fa2", "fa_triton"):
                efficiency *= FA2_RELATIVE_THROUGHPUT
        if work.attention_kernel == "fa_triton":
            efficiency *= calib.triton_fa_relative
        fused = gemm_time(work.attention_flops, bf16_peak,
                          efficiency * attention_key_efficiency(work.attention_keys, calib), half)
    return unfused + fused


def head_dim_efficiency(head_dim: int) -> float:
    """Fused-attention throughput at ``head_dim`` relative to head dimension 128
    (ATTENTION_HEAD_DIM_RELATIVE, cuDNN's measurements): linear in log2 between the measured
    points, held at the ends."""
    (d_low, r_low), (d_high, r_high) = ATTENTION_HEAD_DIM_RELATIVE
    x = min(1.0, max(0.0, math.log2(head_dim / d_low) / math.log2(d_high / d_low)))
    return r_low + x * (r_high - r_low)


def attention_key_efficiency(keys: float, calib: Calibration) -> float:
    """Fraction of a fused-attention kernel's peak throughput reached with ``keys`` keys per
    query: each query block streams its keys through shared memory, so the fixed per-block cost
    (loading Q, the softmax rescale, writing O) is amortised over ``keys`` (FlashAttention-2,
    Dao 2023, arXiv:2307.08691, Fig. 5-6: throughput rises with sequence length and saturates
    past a few thousand). ``keys / (keys + half)``, half the throughput at ``half`` keys."""
    half = calib.attention_half_keys
    if keys <= 0 or half <= 0:
        return 1.0
    return keys / (keys + half)


def pass_times(work: LayerWork, calib: Calibration, precision: str, recompute: str,
               *, is_layer: bool = True, modules: tuple[str, ...] | None = None) -> PassTimes:
    """``_pass_times``, cached under value keys for constants from ``calibration_for``
    (memo.constants_key; a fit's tuned constants are costed afresh)."""
    constants = constants_key(calib)
    if constants is None:
        return _pass_times(work, calib, precision, recompute, is_layer=is_layer, modules=modules)
    return cached(_PASS_TIMES, (work, constants, precision, recompute, is_layer, modules),
                  lambda: _pass_times(work, calib, precision, recompute, is_layer=is_layer,
                                      modules=modules))


def _pass_times(work: LayerWork, calib: Calibration, precision: str, recompute: str,
                *, is_layer: bool = True, modules: tuple[str, ...] | None = None) -> PassTimes:
    """Time of forward, backward (dgrad + wgrad) and recomputation of ``work``.

    Full recomputation repeats a layer's forward. Selective repeats Megatron's ``modules``
    (default core_attn): core_attn the attention kernel, mlp / moe the MLP's or MoE block's
    GEMMs (moe: with its dispatcher passes) and their element-wise work, shared_experts their
    GEMMs, moe_act and layernorm only element-wise work, each in proportion to the bytes it
    re-creates (``LayerWork.module_bytes``). torchtitan's op-level selective checkpointing
    (``op``) reruns the element-wise work and every other linear GEMM (its save list keeps the
    odd matmuls' and SDPA's outputs). The output layer is never recomputed (``is_layer=False``).
    Fused attention runs in BF16 at its own efficiency; unfused attention's batched GEMMs run
    in BF16 at the GEMM efficiency (FP8 recipes only quantise the linear layers).
    """
    times = gemm_times(work.gemms, work.gemm_shapes, calib, precision, work.gemm_groups,
                       work.gemm_one_kernel)
    linear = sum(times)
    attention = attention_forward_s(work, calib)
    attn_gemm = attention if work.attention_gemms else 0.0
    fused = attention - attn_gemm
    factor, bandwidth = calib.elementwise_traffic_factor, calib.hbm_bytes_per_s
    memory = factor * work.elementwise_bytes / bandwidth
    scores = factor * work.score_bytes / bandwidth
    # Permutations are pure data movement: the backward permutes the gradients once more.
    # The dispatcher's per-token-copy bookkeeping and its fixed per-layer cost (host syncs and
    # small kernels, fitted: see profile.py) run in both passes.
    dispatch = (work.dispatch_bytes / (bandwidth * HBM_EFFICIENCY)
                + work.routed_tokens * calib.moe_dispatch_s_per_routed_token
                + (calib.moe_dispatch_s_per_layer if work.routed_tokens else 0.0))
    # Eager expert ops (eager_expert_bytes): memory bound, at the streaming HBM rate.
    eager_fwd, eager_bwd, eager_redo = (b / (bandwidth * HBM_EFFICIENCY)
                                        for b in work.eager_expert_bytes)
    forward = linear + attn_gemm + fused + memory + scores + dispatch + eager_fwd
    backward = (2 * (linear + attn_gemm) + ATTENTION_BACKWARD_RATIO * fused
                + 2 * (memory + scores) + dispatch + eager_bwd)
    # An MoE layer whose kernels the host launches waits for the longer of the GPU and the
    # launches (profile.MOE_HOST_S_PER_LAYER: the per-layer token-count sync stops the host from
    # running ahead); the backward launches twice the GEMMs.
    host = moe_host_launch_s(work, calib)
    forward, backward = max(forward, host), max(backward, 2 * host)
    redo, redo_gemm = 0.0, 0.0
    if is_layer and recompute == "full":
        redo, redo_gemm = forward, linear + attn_gemm
    elif is_layer and recompute == "op":
        redo, redo_gemm = memory + linear / 2, linear / 2
    elif is_layer and recompute == "selective":
        chosen = modules or ("core_attn",)
        if "core_attn" in chosen:
            redo, redo_gemm = attn_gemm + fused + scores, attn_gemm
        mlp_gemms = sum(times[2:])
        shared_gemms = sum(times[len(times) - work.shared_gemms:]) if work.shared_gemms else 0.0
        for name, nbytes in work.module_bytes:
            if name not in chosen or name == "core_attn":
                continue
            gemm = {"mlp": mlp_gemms, "moe": mlp_gemms, "shared_experts": shared_gemms}.get(
                name, 0.0)
            share = nbytes / work.elementwise_bytes if work.elementwise_bytes else 0.0
            redo += gemm + memory * share + (dispatch + eager_fwd if name == "moe" else 0.0)
            redo += eager_redo if name == "moe_act" else 0.0
            redo_gemm += gemm
    return PassTimes(forward, backward, redo, 3 * (linear + attn_gemm) + redo_gemm)


def moe_host_launch_s(work: LayerWork, calib: Calibration) -> float:
    """Host time to launch one MoE layer's forward kernels: a part per layer and a part per
    local expert (profile.MOE_HOST_S_PER_LAYER / MOE_HOST_S_PER_EXPERT); 0 when no host
    launches them (not an MoE layer, or a CUDA-graphed iteration)."""
    if not work.host_launched:
        return 0.0
    return calib.moe_host_s_per_layer + calib.moe_host_s_per_expert * work.launched_experts


def forward_flops_per_token(model: Model, seq_len: int) -> float:
    """Model forward FLOPs per token (non-causal attention, active experts only), cached under
    the model's text and ``seq_len`` (every estimate reads it, for its MFU and HFU)."""
    return cached(_FORWARD_FLOPS, (text_key(model), seq_len),
                  lambda: _forward_flops_per_token(model, seq_len))


_FORWARD_FLOPS: dict[tuple[str, int], float] = new_cache()
_RECOMPUTE_FLOPS: dict[tuple[object, ...], float] = new_cache()


def _forward_flops_per_token(model: Model, seq_len: int) -> float:
    d, a = model.attention_head_dim, model.num_attention_heads
    # A GEMM does 2 FLOPs per weight per token (params.py holds the weight shapes); core
    # attention 2 per key and head dimension in Q K^T (d) and in P V (the value width).
    attention = 2 * attention_projection_params(model) + 2 * a * (
        d + model.value_head_dim) * attended_keys_per_query(model, seq_len, causal=False)
    dense_mlp = 2 * dense_mlp_params(model)
    moe_layers = num_moe_layers(model)
    total = model.num_layers * attention + (model.num_layers - moe_layers) * dense_mlp
    if model.moe is not None and moe_layers:
        per_layer = (2 * router_params(model) + 2 * active_expert_params(model)
                     + 2 * shared_expert_params(model))
        total += moe_layers * per_layer
    return total + 2 * embedding_params(model)


def model_flops_per_step(model: Model, job: Job) -> float:
    """Forward + backward model FLOPs of one step (3 x forward; no recomputation)."""
    return 3 * forward_flops_per_token(model, job.seq_len) * job.tokens_per_step


def recompute_flops_per_step(model: Model, job: Job, layout: Layout) -> float:
    """Extra forward FLOPs recomputation adds (hardware FLOPs = model FLOPs + these). Per token
    they read the model, the sequence and the layout's recompute fields, pp and vpp, cached
    under those."""
    if layout.recompute == "none":
        return 0.0
    key = (text_key(model), job.seq_len, layout.recompute, layout.recompute_modules,
           layout.recompute_layers, layout.pp, layout.vpp)
    return cached(_RECOMPUTE_FLOPS, key,
                  lambda: _recompute_flops_per_token(model, job.seq_len, layout)
                  ) * job.tokens_per_step


def _recompute_flops_per_token(model: Model, seq_len: int, layout: Layout) -> float:
    per_token = forward_flops_per_token(model, seq_len)
    per_token -= 2 * model.hidden_size * model.vocab_size  # the output layer is not redone
    core_attn = model.num_layers * 2 * model.num_attention_heads * (
        (model.attention_head_dim + model.value_head_dim)
        * attended_keys_per_query(model, seq_len, causal=False))
    if layout.recompute == "op":  # every other linear GEMM (pass_times)
        per_token = (per_token - core_attn) / 2
    elif layout.recompute == "selective":
        chosen = layout.recompute_modules or ("core_attn",)
        moe_layers = num_moe_layers(model)
        redo = core_attn if "core_attn" in chosen else 0.0
        if "mlp" in chosen:
            redo += (model.num_layers - moe_layers) * 2 * dense_mlp_params(model)
        if model.moe is not None and ("moe" in chosen or "shared_experts" in chosen):
            shared = 2 * shared_expert_params(model)
            routed = 2 * router_params(model) + 2 * active_expert_params(model)
            redo += moe_layers * (shared + (routed if "moe" in chosen else 0.0))
        per_token = redo
    elif layout.recompute_layers is not None:  # block method: that many layers per stage
        per_token *= min(1.0, layout.recompute_layers * layout.pp * layout.vpp / model.num_layers)
    return per_token


def optimizer_step_time(params_per_gpu: float, calib: Calibration) -> float:
    """Adam over this GPU's (sharded) parameters: a memory-bound sweep."""
    return params_per_gpu * OPTIMIZER_BYTES_PER_PARAM / (calib.hbm_bytes_per_s * HBM_EFFICIENCY)
