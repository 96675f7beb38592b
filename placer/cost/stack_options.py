"""The cost model's software inputs for a job on a stack: the job's runtime settings, else the
stack's defaults, else placer's generic defaults (``CostOptions()``)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from placer.cost.options import DEEPSPEED_MAX_LIVE_PARAMS, DEFAULT_OPTIONS, CostOptions
from placer.spec.job import Job
from placer.spec.runtime import LAUNCH_EXPANDABLE_SEGMENTS
from placer.spec.stack import Stack, load_stack


def options_for(job: Job, stack: Stack | None,
                base: CostOptions = DEFAULT_OPTIONS) -> CostOptions:
    """``base`` with what the job's runtime (or, where it is silent, the stack) says."""
    runtime = job.runtime
    updates: dict[str, object] = {}
    overlaps = runtime.overlaps
    if overlaps is None and stack is not None:
        overlaps = stack.defaults.overlaps
    if overlaps is not None:
        updates.update(tp_comm_overlap="tp" in overlaps, dp_comm_overlap="dp_grad" in overlaps,
                       param_gather_overlap="param_gather" in overlaps,
                       cp_comm_overlap="cp" in overlaps, ep_comm_overlap="ep" in overlaps,
                       p2p_overlap="p2p" in overlaps)
    if stack is not None:
        updates.update(dp_overlap_under_pp=stack.dp_overlap_under_pp,
                       moe_dispatcher=stack.defaults.moe_dispatcher,
                       moe_grouped_gemm=stack.defaults.moe_grouped_gemm,
                       # torchtitan's MoE runs torch._grouped_mm; the others Transformer
                       # Engine's GroupedLinear (compute.expert_gemm_group)
                       moe_grouped_kernel=("single" if stack.framework == "torchtitan"
                                           else "te_streams"),
                       # Megatron-Core's TEGroupedMLP runs a GLU clamp and the expert fc2 bias
                       # as eager ops unless the TE op fuser is on (off by default:
                       # compute.eager_expert_bytes, docs/sources.md section 12)
                       moe_eager_expert_ops=stack.framework == "megatron",
                       # eager PyTorch modules or fused kernels (memory.py, fused_kernels)
                       fused_kernels=stack.defaults.fused_kernels,
                       # torchtitan's loss_parallel, on whenever TP > 1 (options.py)
                       loss_parallel=stack.framework == "torchtitan",
                       attention_kernel=stack.defaults.attention_kernel,
                       # PyTorch FSDP's sharded parameter is the fp32 master (options.py)
                       fsdp_sharded_master=stack.framework in ("torchtitan", "fsdp2"))
    if stack is not None and stack.framework == "deepspeed":
        # DeepSpeed's optimizer wrapper per layout (placer.cost.deepspeed_optimizer) and its
        # ZeRO-3 fetch limit (options.DEEPSPEED_MAX_LIVE_PARAMS)
        updates.update(deepspeed_engine=True, zero3_max_live_params=DEEPSPEED_MAX_LIVE_PARAMS)
    if runtime.moe_dispatcher is not None:
        updates["moe_dispatcher"] = runtime.moe_dispatcher
    if runtime.moe_grouped_gemm is not None:
        updates["moe_grouped_gemm"] = runtime.moe_grouped_gemm
    if runtime.moe_load_imbalance is not None:
        updates["moe_load_imbalance"] = runtime.moe_load_imbalance
    if runtime.moe_capacity_factor is not None:
        updates["moe_capacity_factor"] = runtime.moe_capacity_factor
    # None: the allocator as placer's launch env.sh configures it (spec/runtime.py).
    updates["expandable_segments"] = (LAUNCH_EXPANDABLE_SEGMENTS if runtime.expandable_segments
                                      is None else runtime.expandable_segments)
    if runtime.fp8_recipe == "mxfp8":
        # block-scaled GEMMs (profile.MXFP8_GEMM_TIME_RATIO)
        updates["mxfp8_gemms"] = True
    if runtime.cross_entropy_impl is not None:
        updates["cross_entropy_impl"] = runtime.cross_entropy_impl
    if runtime.torch_compile:
        # what the stack compiles (Stack.compile_components; the job validator refuses a stack
        # that compiles nothing); without a stack both, as torchtitan's default components
        components = stack.compile_components if stack is not None else ("layers", "loss")
        updates.update(compiled_layers="layers" in components,
                       compiled_loss="loss" in components)
    return replace(base, **updates) if updates else base  # type: ignore[arg-type]


@lru_cache(maxsize=256)
def job_options(job: Job) -> CostOptions:
    """The cost options of ``job`` on its own stack (``Job.stack``; none: generic defaults)."""
    return options_for(job, load_stack(job.stack) if job.stack is not None else None)
