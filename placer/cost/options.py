"""How the training framework runs what a layout describes: the cost model's software inputs.

The defaults describe a current Megatron-Core / torchtitan job: fused (flash) attention, gradient
reduction overlapped with backward, tensor-parallel collectives on the critical path. Published
runs from older frameworks differ (unfused attention before 2022, DeepSpeed's pipeline engine
reducing gradients after the last micro-batch), and bench/accuracy.py sets these per source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Default load imbalance across experts: the busiest rank receives this multiple of the mean
# token count. Switch Transformer and GShard train with an expert capacity factor of 1.25
# (Fedus et al. 2021, arXiv:2101.03961, section 2.2); dropless routing behaves similarly.
MOE_LOAD_IMBALANCE = 1.25
# DeepSpeed ZeRO-3 defaults (deepspeed/runtime/zero/config.py; docs/sources.md 7.1): parameters
# are fetched per submodule, at most ``stage3_max_live_parameters`` held at once beyond the one
# in use, ``stage3_prefetch_bucket_size`` fetched ahead, and gradients reduce-scattered from a
# ``reduce_bucket_size`` buffer.
DEEPSPEED_MAX_LIVE_PARAMS = 1e9
DEEPSPEED_PREFETCH_BUCKET_PARAMS = 5e7
DEEPSPEED_REDUCE_BUCKET_PARAMS = 5e8
# The fused-attention kernels the cost model prices (CostOptions.attention_kernel).
AttentionKernel = Literal["cudnn", "fa2", "fa_triton"]


@dataclass(frozen=True)
class CostOptions:
    """Framework behaviour the layout does not say."""

    flash_attention: bool = True
    """Fused attention: no s x s scores stored or moved; causal blocks skipped."""
    attention_kernel: AttentionKernel = "cudnn"
    """Fused-attention kernel: ``cudnn`` (Transformer Engine's cuDNN fused attention, or
    FlashAttention-3, on Hopper and later), ``fa2`` (FlashAttention-2, what PyTorch's SDPA
    flash backend runs), slower on Hopper (compute.FA2_RELATIVE_THROUGHPUT), or ``fa_triton``
    (FlashAttention in Triton, MPT's ``attn_impl: triton``), at profile.TRITON_FA_RELATIVE of
    FlashAttention-2's rate."""
    expandable_segments: bool = False
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (torchtitan's run_train.sh, NeMo's
    performance executors): no fragmentation allowance (memory._fragmentation)."""
    grads_reallocated: bool = False
    """The optimizer frees the gradients at every step and autograd allocates them again in the
    next backward, among the activations, so they count toward the fragmentation allowance:
    DeepSpeed's ZeRO-1/2 optimizer copies each ``.grad`` into its reduce bucket or partition
    buffer and drops it (microsoft/DeepSpeed@2151c78 deepspeed/runtime/zero/stage_1_and_2.py,
    reduce_independent_p_g_buckets_and_remove_grads, independent_gradient_partition_epilogue
    zero_grad). False: a persistent gradient buffer (Megatron's main_grad, DDP buckets)."""
    deepspeed_bf16_optimizer: bool = False
    """DeepSpeed's BF16_Optimizer (which configs run it: placer.cost.deepspeed_optimizer;
    microsoft/DeepSpeed@56c5223 and deepspeedai/DeepSpeed@edaa722 deepspeed/runtime/
    bf16_optimizer.py, runtime/pipe/engine.py, runtime/engine.py). Beside the persistent flat
    gradient buffer in the accumulation dtype (counted as the gradients), the stage's bf16
    ``.grad`` lives from the backward to the step, which drops it (@56c5223 already before each
    backward: clear_lp_grads): memory.BF16_BYTES more per parameter, counted toward the
    fragmentation allowance. It partitions the fp32 master weights and optimizer state over the
    data-parallel group at ZeRO stage 0 too (_setup_for_real_optimizer). At the step, after the
    activations are freed, it allocates deepspeed_optimizer.bf16_step_bytes."""
    deepspeed_fp16_optimizer: bool = False
    """DeepSpeed's FP16_Optimizer (fp16, or bf16 without the pipeline engine, at ZeRO stage 0):
    model-dtype gradients freed at every step (pair it with ``grads_reallocated``), and at the
    step deepspeed_optimizer.FP16_STEP_BYTES_PER_PARAM of fp32 gradient copies."""
    deepspeed_engine: bool = False
    """The job runs DeepSpeed's engine as placer's DeepSpeed dialect configures it (the
    deepspeed@0.19 stack): the optimizer wrapper, and with it the three flags above and the
    gradient bytes, follow each layout's ZeRO stage and pipeline
    (deepspeed_optimizer.placer_wrapper)."""
    cross_entropy_impl: Literal["native", "te", "flash_attn"] = "native"
    """Fused cross-entropy kernel (Megatron --cross-entropy-fusion-impl): ``native`` Megatron's
    vocab-parallel one on fp32 logits; ``te`` Transformer Engine's, which keeps the bf16 logits and
    writes the gradient into them (memory.TE_LOSS_PEAK_BYTES_PER_ENTRY); ``flash_attn`` the
    flash-attn package's CrossEntropyLoss (llm-foundry's MPT), which keeps the bf16 logits and
    writes a new bf16 gradient (memory.FLASH_ATTN_LOSS_PEAK_BYTES_PER_ENTRY)."""
    loss_parallel: bool = False
    """The unfused cross-entropy runs under DTensor's loss_parallel when TP > 1, as torchtitan
    does by default (memory.LOSS_PARALLEL_PEAK_BYTES_PER_ENTRY)."""
    pipeline_keeps_outputs: bool = False
    """torch.distributed.pipelining's last stage keeps every micro-batch's output (the logits)
    in ``output_chunks`` until the step ends and then concatenates them, unless
    ``step(return_outputs=False)`` (pytorch/pytorch#165822; torch 2.13 stage.py
    forward_one_chunk, schedules.py _merge_outputs). torchtitan passes it from
    pytorch/torchtitan@e5ef99aab (Oct 2025, v0.2.1) on; its Dec 2024 runs (torchtitan@9dec370
    train.py: ``pp_schedule.step(target=labels, losses=losses)``) did not. Measured with a
    one-rank pipeline in tests/test_memory_pytorch.py."""
    compiled_loss: bool = False
    """The loss is torch.compile'd (torchtitan's --training.compile): it keeps only the bf16
    logits, not an fp32 log-softmax (memory.COMPILED_LOSS_PEAK_BYTES_PER_ENTRY)."""
    compiled_layers: bool = False
    """The transformer layers are torch.compile'd (torchtitan's --training.compile compiles each
    block): under op-level selective checkpointing AOTAutograd's partitioner saves only what the
    compiled backward reads, so the policy's saved output of the MLP's down projection (w2,
    which only feeds the residual add) is not kept (memory.activation_bytes_per_token; measured
    in tests/test_memory_pytorch.py with PyTorch's min-cut partitioner, the one Inductor uses).
    Eager modules only (``fused_kernels`` False); the SP reduce-scatter outputs are kept as
    eager keeps them (not measured with a real collective)."""
    fused_kernels: bool = True
    """Megatron-Core / Transformer Engine kernels: fused QKV and gate+up projections, a fused
    SwiGLU that saves only its input, contiguous q/k/v, and under sequence parallelism linears
    that save the local shard. False: eager PyTorch modules as torchtitan's Llama (separate
    projections, ``silu(w1 x) * w3 x``, ``repeat_kv``, DTensor saving the gathered input) and an
    unfused fp32 cross-entropy (tests/test_memory_pytorch.py measures both)."""
    tp_comm_overlap: bool = False
    """TP collectives pipelined with the layer's GEMMs (Megatron --tp-comm-overlap, async TP)."""
    dp_comm_overlap: bool = True
    """Gradient reduction bucketed and overlapped with the last micro-batch's backward."""
    moe_load_imbalance: float = MOE_LOAD_IMBALANCE
    """Tokens the busiest expert rank receives, as a multiple of the mean (1 = balanced)."""
    zero3_max_live_params: float | None = None
    """ZeRO-3 without pipelining: None gathers whole layers (FSDP units: the current layer and
    the prefetched next); a number bounds the parameters held at once as DeepSpeed does
    (``stage3_max_live_parameters``, 1e9 by default), fetching per submodule."""
    fsdp_sharded_master: bool = False
    """PyTorch FSDP (FSDP2's ``fully_shard``, FSDP1's flat parameters; torchtitan, NeMo
    AutoModel, llm-foundry's Composer) at ZeRO-3 keeps one sharded parameter in the model's dtype,
    which the optimizer updates in place, and casts it to the mixed-precision ``param_dtype``
    only for the all-gather (torch/distributed/fsdp/_fully_shard/_fsdp_param.py
    ``all_gather_inputs``; FSDP1 frees its low-precision shard after the all-gather): with an
    fp32 master copy no sharded working-dtype copy persists (memory.sharded_weight_bytes;
    measured 16 bytes per parameter with Adam in tests/test_memory_fsdp_pytorch.py). False: a
    working-dtype shard beside the fp32 master (DeepSpeed ZeRO-3's partitioned ``ds_tensor``;
    Megatron's parameter buffer beside its distributed optimizer's main parameters)."""
    param_gather_overlap: bool = True
    """ZeRO-1/2 parameter all-gather (and FSDP prefetch) behind the next forward
    (Megatron --overlap-param-gather); False: on the critical path after the optimizer step."""
    cp_comm_overlap: bool = True
    """CP K/V ring exchange behind each block of attention (Transformer Engine's ring)."""
    ep_comm_overlap: bool = False
    """MoE all-to-all behind the other micro-batch's compute (Megatron
    --overlap-moe-expert-parallel-comm, DualPipe F&B chunks); False: on the critical path."""
    p2p_overlap: bool = True
    """Interleaved-schedule stage sends behind the next chunk (--overlap-p2p-communication)."""
    dp_overlap_under_pp: bool = True
    """Gradient reduction overlaps the last micro-batch's backward under pipelining (DeepSpeed's
    pipeline engine reduces after the flush: False)."""
    moe_dispatcher: str = "alltoall"
    """MoE token dispatcher: alltoall, allgather or flex (placer.spec.runtime.Dispatcher)."""
    moe_grouped_gemm: bool = True
    """Local experts run as one grouped GEMM; False: one kernel launch per expert."""
    moe_grouped_kernel: Literal["te_streams", "single"] = "te_streams"
    """How the grouped GEMM runs (compute.expert_gemm_group): ``te_streams`` Transformer
    Engine's GroupedLinear (Megatron --moe-grouped-gemm), one cuBLAS GEMM per expert on 4
    concurrent streams; ``single`` one grouped kernel over every local expert
    (torch._grouped_mm, torchtitan's MoE)."""
    fp4_gemms: bool = False
    """An FP8 job's linear-layer GEMMs in NVFP4 (Transformer Engine's NVFP4 recipe) on GPUs with
    FP4 tensor cores (profile.FP4_OVER_FP8_PEAK); attention and the output layer keep the
    job's precision, and MFU stays of its peak."""
    mxfp8_gemms: bool = False
    """An FP8 job's linear-layer GEMMs under MXFP8 block scaling (Transformer Engine's
    MXFP8BlockScaling, Blackwell): block-scaled GEMMs, slower than per-tensor-scaled FP8 ones
    by profile.MXFP8_GEMM_TIME_RATIO; attention and the output layer as ``fp4_gemms``."""
    cuda_graphs: bool = False
    """The whole iteration is captured in CUDA graphs (Megatron ``cuda_graph_impl=full_iteration``):
    kernels replay without host launches, so no layer waits on the CPU (compute.pass_times)."""
    moe_eager_expert_ops: bool = False
    """Megatron-Core's TEGroupedMLP runs the clamp of a clamped GLU (Model.activation_clamp)
    and the expert fc2 bias as eager PyTorch ops on every routed token copy
    (compute.eager_expert_bytes); False: fused into the grouped MLP (the TE op fuser, the
    CuTeDSL grouped MLP) or absent."""
    moe_capacity_factor: float | None = None
    """Expert capacity as a multiple of the mean load (tokens beyond it dropped); None: dropless."""

    @property
    def routed_imbalance(self) -> float:
        """Load on the busiest expert rank as a multiple of the mean: the imbalance, capped by
        the capacity factor when tokens beyond capacity are dropped (GShard, Switch)."""
        if self.moe_capacity_factor is None:
            return self.moe_load_imbalance
        return max(1.0, min(self.moe_load_imbalance, self.moe_capacity_factor))

    def __post_init__(self) -> None:
        if not 1.0 <= self.moe_load_imbalance <= 64.0:
            raise ValueError("moe_load_imbalance must be between 1 and 64")
        if self.zero3_max_live_params is not None and self.zero3_max_live_params <= 0:
            raise ValueError("zero3_max_live_params must be positive")


DEFAULT_OPTIONS = CostOptions()
