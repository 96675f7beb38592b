"""Peak memory per GPU: weights, gradients, optimizer state, activations, buffers, overheads.

Every pipeline stage is costed and the worst one is reported. Activations follow Korthikanti et
al. 2022 (arXiv:2205.05198, Table 2; conventions.md 9.2), generalised to grouped-query attention,
gated MLPs, any FFN width, context parallelism and mixture-of-experts layers. Attention is
fused (flash attention) by default, so the ``5as/h`` score and softmax terms are not stored;
``CostOptions(flash_attention=False)`` restores them, and selective recomputation drops them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placer.cost.options import (
    DEEPSPEED_PREFETCH_BUCKET_PARAMS,
    DEEPSPEED_REDUCE_BUCKET_PARAMS,
    MOE_LOAD_IMBALANCE,
    CostOptions,
)
from placer.cost.params import (
    StageShape,
    largest_weight_params,
    stage_params,
    stage_shapes,
    total_params,
)
from placer.cost.profile import bounding_node_type
from placer.cost.stack_options import job_options
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.results import MemoryBreakdown

# CUDA context, kernels and library workspaces per process: ~1 GB with all kernels loaded
# (pytorch#28394), ~0.3 GB with lazy loading (pytorch#107667); cuBLAS/cuDNN/TE workspaces and
# the caching allocator's own blocks take the rest of this allowance.
FRAMEWORK_BASE_BYTES = 1 << 30
# NCCL buffers per communicator: NCCL_BUFFSIZE 4 MiB (conventions.md 3) per peer direction, two
# peers on a ring, up to 32 channels: 4 MiB x 2 x 32 = 256 MiB.
NCCL_BYTES_PER_COMMUNICATOR = 4 * 2**20 * 2 * 32
# Allocator fragmentation: the share of reserved memory the caching allocator cannot hand out.
# GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156) measured 15 % on average (up to 33 %) over
# eight LLMs trained on A100 80GB with recomputation, ZeRO and offloading; it comes from the
# irregular allocation and freeing of activations and transient buffers, so it is applied to
# those, not to weights and optimizer state allocated once.
FRAGMENTATION_FRACTION = 0.15
# Output logits and cross-entropy buffers: 4 bytes per vocabulary entry per token, as in
# Megatron's estimator (4*s*b*V, conventions.md 9.2).
LOGITS_BYTES_PER_ENTRY = 4
# Token ids, positions and the embedding dropout mask held per in-flight micro-batch on the first
# stage: Megatron's estimator adds 8*s*b (int64 ids) and s*b*h (mask) per micro-batch.
EMBEDDING_ID_BYTES_PER_TOKEN = 8
BF16_BYTES = 2
FP8_BYTES = 1
ROUTER_PROB_BYTES = 4  # fp32 router probability kept per routed token


@dataclass(frozen=True)
class ActivationParts:
    """Bytes per token of one layer's stored activations, on one GPU."""

    attention: float
    mlp: float
    checkpoint: float  # what full recomputation keeps: the layer input

    @property
    def total(self) -> float:
        return self.attention + self.mlp


def _kv_heads_per_gpu(model: Model, tp: int) -> float:
    """KV heads each TP rank holds: g/t, or one replicated head when t exceeds g."""
    return max(model.kv_heads / tp, 1.0)


def activation_bytes_per_token(model: Model, layout: Layout, moe_layer: bool, *,
                               flash_attention: bool = True, seq_len: int = 0,
                               fp8: bool = False,
                               moe_load_imbalance: float = MOE_LOAD_IMBALANCE) -> ActivationParts:
    """Stored activation bytes per token of one layer on one GPU (Korthikanti, generalised).

    With a plain MHA model of FFN 4h, no flash attention and tp = t this is Table 2 exactly:
    ``h (10 + 24/t + 5as/(ht))`` per token, ``34h/t`` with sequence parallelism.
    ``seq_len`` (the attended length) only matters without flash attention. With ``fp8`` the
    inputs of the linear layers are kept in FP8 for their backward GEMMs (Transformer Engine
    saves the quantised input), one byte instead of two.
    """
    h, d, a = model.hidden_size, model.attention_head_dim, model.num_attention_heads
    t = layout.tp
    rep = 1.0 / t if layout.sequence_parallel else 1.0  # tensors TP would otherwise replicate
    kv = _kv_heads_per_gpu(model, t)
    b = BF16_BYTES
    lin = FP8_BYTES if fp8 else BF16_BYTES  # inputs of linear layers
    attention = (2 * b * h * rep  # two norm inputs (attention and MLP), counted here
                 + lin * h * rep  # QKV projection input
                 + b * a * d / t + 2 * b * kv * d  # Q, K, V
                 + lin * a * d / t  # output projection input
                 + h * rep)  # attention dropout mask (1 byte)
    if flash_attention:
        attention += 4 * a / t  # softmax log-sum-exp, fp32 per head
    else:
        attention += 5 * a * seq_len / t  # scores, softmax, dropout mask and output
    if moe_layer and model.moe is not None:
        mlp = _moe_mlp_bytes_per_token(model, layout, moe_load_imbalance, lin)
    else:
        ffn = model.ffn_hidden_size
        mlp = (lin * h * rep  # first linear input
               + b * ffn * (2 if model.gated_mlp else 1) / t  # activation-function input(s)
               + lin * ffn / t  # second linear input
               + h * rep)  # MLP dropout mask
    return ActivationParts(attention=attention, mlp=mlp, checkpoint=b * h * rep)


def _moe_mlp_bytes_per_token(model: Model, layout: Layout, imbalance: float,
                             lin: int) -> float:
    """MoE block: router, dispatched copies of each token, expert MLPs, shared experts."""
    moe = model.moe
    assert moe is not None
    h, t, b = model.hidden_size, layout.tp, BF16_BYTES
    rep = 1.0 / t if layout.sequence_parallel else 1.0
    gate = 2 if model.gated_mlp else 1
    # Routed tokens each GPU processes per local token (experts span tp x cp x dp).
    routed = moe.top_k * layout.etp / t * imbalance
    fe = moe.expert_ffn_hidden_size / layout.etp
    # Permuted input (first expert GEMM's input), activation inputs, second GEMM's input and the
    # token's fp32 router probability. The probability scales the activation inside the expert
    # (Megatron-Core moe/experts.py: TEGroupedMLP.forward(..., permuted_probs) through
    # weighted_bias_swiglu_impl; torchtitan's MoE scales the input, score_before_experts), so
    # the combine is a plain sum and keeps no copy of the expert output.
    per_routed = lin * h + b * fe * gate + lin * fe + ROUTER_PROB_BYTES
    shared_ffn = (moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size)
    shared = moe.num_shared_experts * (b * shared_ffn * gate + lin * shared_ffn) / t
    router = b * h * rep + 4 * moe.num_experts * rep  # router input and fp32 probabilities
    return router + routed * per_routed + shared + h * rep


def microbatches_in_flight(layout: Layout, stage: int, num_microbatches: int) -> float:
    """Micro-batches whose activations a stage holds at its peak, in units of full stages.

    1F1B: stage r holds ``min(p - r, m)``. Interleaved (Megatron): rank r runs
    ``2(p - r - 1) + (v - 1)p`` warm-up chunks plus one, each 1/v of its layers, which for r = 0
    is Megatron's ``p (1 + (p - 1)/(p v))`` (conventions.md 9.2).
    """
    p, v, m = layout.pp, layout.vpp, max(1, num_microbatches)
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(p - stage, m))
    chunks = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    return chunks / v


@dataclass(frozen=True)
class _StageMemory:
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    moe_buffers: float
    transient: float


def _zero_shards(layout: Layout) -> tuple[int, int]:
    """How many ways dense and expert state are sharded by ZeRO (dp x cp, and expert-dp)."""
    return layout.dp * layout.cp, layout.expert_dp


def _activation_parts(model: Model, job: Job, layout: Layout,
                      options: CostOptions) -> tuple[ActivationParts, ActivationParts]:
    """Per-token activations of a dense and of an MoE layer (the same on every stage)."""
    # Selective recomputation re-runs core attention, so its scores are never kept.
    flash = options.flash_attention or layout.recompute == "selective"
    fp8 = job.precision == "fp8"
    return tuple(  # type: ignore[return-value]
        activation_bytes_per_token(model, layout, moe, flash_attention=flash,
                                   seq_len=job.seq_len, fp8=fp8,
                                   moe_load_imbalance=options.moe_load_imbalance)
        for moe in (False, True))


def _stage_memory(model: Model, job: Job, layout: Layout, shape: StageShape,
                  options: CostOptions, acts: tuple[ActivationParts, ActivationParts]
                  ) -> _StageMemory:
    opt = job.optimizer
    params = stage_params(model, layout, shape)
    dense_shard, expert_shard = _zero_shards(layout)
    zero = layout.zero_stage

    def sharded(count_dense: float, count_expert: float, stage_from: int) -> float:
        if zero >= stage_from:
            return count_dense / dense_shard + count_expert / expert_shard
        return count_dense + count_expert

    weights = sharded(params.dense, params.expert, 3) * opt.param_bytes
    gradients = sharded(params.dense, params.expert, 2) * opt.grad_bytes
    optimizer = sharded(params.dense, params.expert, 1) * opt.sharded_state_bytes

    tokens = layout.micro_batch_size * job.seq_len / layout.cp  # per GPU per micro-batch
    m = layout.num_microbatches(job.global_batch_size)
    held = microbatches_in_flight(layout, shape.stage, m)
    imbalance = options.moe_load_imbalance
    dense_act, moe_act = acts
    dense_layers = shape.layers - shape.moe_layers
    # The backward of a layer holds its activations and their gradients at once: one layer's
    # worth on top of what is kept (with full recomputation, its recomputed activations too).
    worst_layer = (moe_act.total if shape.moe_layers else dense_act.total) * tokens
    if layout.recompute == "full":
        # Inputs of every layer for every in-flight micro-batch, plus one layer recomputed.
        kept = shape.layers * held * dense_act.checkpoint * tokens
        activations = kept + 2 * worst_layer
    else:
        per_mb = (dense_layers * dense_act.total + shape.moe_layers * moe_act.total) * tokens
        activations = per_mb * held + worst_layer
    rep = 1.0 / layout.tp if layout.sequence_parallel else 1.0
    if shape.first:
        activations += held * tokens * (EMBEDDING_ID_BYTES_PER_TOKEN + model.hidden_size * rep)
    logits = 0.0
    if shape.last:
        logits = tokens * model.vocab_size / layout.tp * LOGITS_BYTES_PER_ENTRY
    moe_buffers = 0.0
    if shape.moe_layers and model.moe is not None:
        routed = tokens * model.moe.top_k * layout.etp / layout.tp * imbalance
        moe_buffers = 2 * routed * model.hidden_size * BF16_BYTES  # dispatch + combine buffers
    transient = 0.0
    layer_params = params.total / max(1, shape.layers)
    if zero >= 3 and layout.pp > 1:
        # FSDP2 under pipelining (torchtitan's default) keeps the stage unsharded for the whole
        # step and accumulates unsharded gradients in the parameter dtype between micro-batches.
        weights += params.total * opt.param_bytes
        gradients += params.total * opt.param_bytes
    elif zero >= 3:
        transient = _zero3_transient(model, layout, layer_params, job, options)
    elif zero == 2:
        transient = layer_params * opt.grad_bytes  # a layer's gradients before reduce-scatter
    return _StageMemory(weights, gradients, optimizer, activations, logits, moe_buffers,
                        transient)


def _zero3_transient(model: Model, layout: Layout, layer_params: float, job: Job,
                     options: CostOptions) -> float:
    """Unsharded parameters and gradients ZeRO-3 holds at once (no pipelining).

    FSDP gathers whole layers: the current one and the prefetched next, plus one layer's
    gradients before their reduce-scatter. DeepSpeed fetches per submodule: the largest weight
    in use plus what its live-parameter limit and prefetch bucket allow, and reduce-scatters
    gradients from a fixed bucket (options.py).
    """
    opt = job.optimizer
    limit = options.zero3_max_live_params
    if limit is None:
        return layer_params * (2 * opt.param_bytes + opt.grad_bytes)
    largest = largest_weight_params(model, layout)
    live = min(2 * layer_params, max(limit, largest) + DEEPSPEED_PREFETCH_BUCKET_PARAMS)
    grads = min(layer_params, DEEPSPEED_REDUCE_BUCKET_PARAMS)
    return live * opt.param_bytes + grads * opt.grad_bytes


def _fragmentation(dynamic_bytes: float) -> float:
    """Reserved-but-unusable memory when ``dynamic_bytes`` are live (fraction f of reserved)."""
    return dynamic_bytes * FRAGMENTATION_FRACTION / (1.0 - FRAGMENTATION_FRACTION)


def _communicators(layout: Layout, moe: bool) -> int:
    """Process groups a rank talks on (each holds NCCL buffers)."""
    sizes = [layout.tp, layout.pp, layout.dp * layout.cp, layout.cp]
    if moe:
        sizes += [layout.ep, layout.etp, layout.expert_dp]
    return max(1, sum(1 for s in sizes if s > 1))


def capacity_bytes(cluster: Cluster, job: Job) -> int:
    """Usable memory per GPU: the smallest GPU of the cluster, less the job's headroom."""
    gpu = bounding_node_type(cluster).gpu
    return int(gpu.capacity_bytes * (1.0 - job.memory_headroom))


def memory_estimate(model: Model, cluster: Cluster, job: Job, layout: Layout,
                    options: CostOptions | None = None) -> MemoryBreakdown:
    """Peak memory of the worst pipeline stage (cheap: no topology, O(pp + layers)); options
    None: the job's own on its stack (stack_options.job_options)."""
    if options is None:
        options = job_options(job)
    framework = FRAMEWORK_BASE_BYTES + NCCL_BYTES_PER_COMMUNICATOR * _communicators(
        layout, model.moe is not None)
    best: tuple[float, int, _StageMemory] | None = None
    acts = _activation_parts(model, job, layout, options)
    seen: set[tuple[int, int, bool, bool]] = set()  # StageShape.kind
    for shape in stage_shapes(model, layout):
        # Stages of the same shape differ only in the micro-batches they hold, which never
        # grow with the stage index: the earliest of each shape is its worst (O(shapes)).
        if shape.kind in seen:
            continue
        seen.add(shape.kind)
        mem = _stage_memory(model, job, layout, shape, options, acts)
        dynamic = mem.activations + mem.logits + mem.moe_buffers + mem.transient
        total = mem.weights + mem.gradients + mem.optimizer + dynamic + _fragmentation(dynamic)
        if best is None or total > best[0]:
            best = (total, shape.stage, mem)
    assert best is not None
    _, stage, mem = best
    dynamic = mem.activations + mem.logits + mem.moe_buffers + mem.transient
    parts = {
        "weights_bytes": math.ceil(mem.weights),
        "gradients_bytes": math.ceil(mem.gradients),
        "optimizer_bytes": math.ceil(mem.optimizer),
        "activations_bytes": math.ceil(mem.activations + mem.transient),
        "logits_bytes": math.ceil(mem.logits),
        "moe_buffers_bytes": math.ceil(mem.moe_buffers),
        "framework_bytes": framework,
        "fragmentation_bytes": math.ceil(_fragmentation(dynamic)),
    }
    return MemoryBreakdown(**parts, total_bytes=sum(parts.values()),
                           capacity_bytes=capacity_bytes(cluster, job), worst_stage=stage)


def training_state_bytes(model: Model, job: Job) -> int:
    """Weights, gradients and optimizer state of the whole model (what ZeRO-3 can shard)."""
    opt = job.optimizer
    per_param = opt.param_bytes + opt.grad_bytes + opt.sharded_state_bytes
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
