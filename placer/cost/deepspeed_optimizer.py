"""Which optimizer wrapper DeepSpeed's engine runs for a config, and how it holds gradients.

The rule is ``DeepSpeedEngine._do_optimizer_sanity_check`` and ``_configure_optimizer``
(deepspeed/runtime/engine.py). At 0.19 (deepspeedai/DeepSpeed@edaa722, 0.19.6; the same code
in the 0.19.8 wheel) it reads the ZeRO stage, fp16/bf16 and ``data_types.grad_accum_dtype``
(``get_data_types``: unset means the model's dtype) and whether the pipeline engine runs:

- ZeRO stage >= 1: ``DeepSpeedZeroOptimizer`` (stage 1, 2) or ``DeepSpeedZeroOptimizer_Stage3``,
  except bf16 with fp32 gradient accumulation at stage 1 without CPU offload: ``BF16_Optimizer``;
- stage 0, accumulation in the model's dtype: fp32 runs the client optimizer as it is; bf16
  under the pipeline engine ``BF16_Optimizer`` (with a warning); fp16, and bf16 without the
  pipeline engine (``DDP_BFLOAT16``), ``FP16_Optimizer``;
- stage 0 with another accumulation dtype (bf16 with fp32): DeepSpeed refuses it at start-up;
  ``optimizer_wrapper`` raises ValueError naming the fix, and ``check`` reports it as
  ``framework-refuses``.

BigScience's BLOOM runs (DeepSpeed@2151c78 fp16, @56c5223 bf16, 2022) predate the dtype
checks: ``_configure_optimizer`` picks ZeRO at stage >= 1, else ``FP16_Optimizer`` for fp16,
else ``BF16_Optimizer`` for bf16, and that BF16_Optimizer always accumulates in fp32.

What each wrapper keeps (the memory mechanisms of placer.cost.memory):

- ``DeepSpeedZeroOptimizer``: the model-dtype ``.grad`` of each parameter is copied into the
  reduce bucket or partition and dropped (stage_1_and_2.py clear_grad_attribute, and at
  @2151c78 reduce_independent_p_g_buckets_and_remove_grads): ``grads_reallocated``.
- ``BF16_Optimizer``: a flat gradient buffer in the accumulation dtype beside each parameter's
  bf16 ``.grad``, which ``zero_grad(set_to_none=True)`` frees at every step (@56c5223 already
  at every backward), and the fp32 master weights and optimizer state partitioned over the
  data-parallel group even at ZeRO stage 0 (bf16_optimizer.py _setup_for_real_optimizer):
  ``deepspeed_bf16_optimizer``.
- ``FP16_Optimizer``: model-dtype ``.grad`` freed by ``zero_grad(set_to_none=True)`` at every
  step (fp16/fused_optimizer.py), and at the step each group's gradients cast to fp32 one by one
  and then flattened into a new fp32 buffer while the cast copies are held:
  ``deepspeed_fp16_optimizer``. That is the fused wrapper, built for a FusedAdam optimizer
  (engine.py _configure_fp16_optimizer); FP16_UnfusedOptimizer's per-parameter casts hold less,
  so it is priced as an upper bound.
- ``DeepSpeedZeroOptimizer_Stage3``: ZeRO-3's own fetch and bucket limits
  (options.zero3_max_live_params) with its partitioned gradients; the plain optimizer:
  persistent gradients.

tests/test_deepspeed_optimizer.py runs DeepSpeed's own selection over every stage, precision,
accumulation dtype and pipeline setting, and measures these buffers on a real engine on CPU.
"""

from __future__ import annotations

from typing import Literal

Wrapper = Literal["BF16_Optimizer", "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3",
                  "FP16_Optimizer", "client"]
Precision = Literal["fp32", "fp16", "bf16"]
Release = Literal["0.19", "2022"]
"""``0.19``: the stack preset's DeepSpeed (deepspeed@0.19); ``2022``: the BigScience-era engine
(microsoft/DeepSpeed@2151c78 and @56c5223) that BLOOM's runs used."""

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def optimizer_wrapper(zero_stage: int, precision: Precision, pipeline: bool,
                      grad_accum_dtype: Precision | None = None, cpu_offload: bool = False,
                      release: Release = "0.19") -> Wrapper:
    """The wrapper ``deepspeed.initialize`` builds for these config settings (module docstring).

    ``precision``: ``fp16.enabled`` / ``bf16.enabled`` (neither: fp32); ``pipeline``: the model
    is a ``PipelineModule`` (PipelineEngine); ``grad_accum_dtype``: ``data_types.
    grad_accum_dtype`` (None: unset). Raises ValueError where DeepSpeed refuses the mix.
    """
    if release == "2022":
        if zero_stage >= 1:
            return "DeepSpeedZeroOptimizer" if zero_stage < 3 else "DeepSpeedZeroOptimizer_Stage3"
        return {"fp16": "FP16_Optimizer", "bf16": "BF16_Optimizer"}.get(precision, "client")  # type: ignore[return-value]
    accumulation = grad_accum_dtype or precision
    if zero_stage >= 1:
        if (precision == "bf16" and accumulation == "fp32" and zero_stage == 1
                and not cpu_offload):
            return "BF16_Optimizer"
        return "DeepSpeedZeroOptimizer" if zero_stage < 3 else "DeepSpeedZeroOptimizer_Stage3"
    if accumulation != precision:
        raise ValueError(f"DeepSpeed {release} refuses {precision} weights with "
                         f"{accumulation} gradient accumulation at ZeRO stage 0 (engine.py "
                         "_do_optimizer_sanity_check: 'unsupported mix'); use ZeRO stage 1 "
                         "or drop data_types.grad_accum_dtype")
    if precision == "fp32":
        return "client"
    if precision == "bf16" and pipeline:
        return "BF16_Optimizer"
    return "FP16_Optimizer"


def gradient_bytes(wrapper: Wrapper, precision: Precision,
                   grad_accum_dtype: Precision | None = None, release: Release = "0.19") -> int:
    """Bytes per parameter of the gradients the wrapper accumulates: the accumulation dtype
    (unset: the model's), fp32 in the 2022 BF16_Optimizer (it had no other)."""
    if wrapper == "BF16_Optimizer" and release == "2022":
        return DTYPE_BYTES["fp32"]
    return DTYPE_BYTES[grad_accum_dtype or precision]


def memory_flags(wrapper: Wrapper) -> dict[str, bool]:
    """The CostOptions memory mechanisms of ``wrapper`` (module docstring)."""
    return {"grads_reallocated": wrapper in ("DeepSpeedZeroOptimizer", "FP16_Optimizer"),
            "deepspeed_bf16_optimizer": wrapper == "BF16_Optimizer",
            "deepspeed_fp16_optimizer": wrapper == "FP16_Optimizer"}


def bf16_step_bytes(stage_params: float, partition_params: float, grad_bytes: int) -> float:
    """What BF16_Optimizer allocates at the step, after the activations are freed: with fp32
    accumulation the data-parallel all-reduce casts each flat gradient group whole to the bf16
    communication dtype (engine.py communication_data_type, allreduce_bucket; buckets group
    tensors but never split one): 2 bytes per parameter of the stage. Accumulated in bf16 the
    all-reduce runs in place, and the step casts the rank's partition to fp32 for the fp32
    master weights (bf16_optimizer.py step, ``grad_partition.to(param_partition.dtype)``)."""
    if grad_bytes == DTYPE_BYTES["fp32"]:
        return stage_params * DTYPE_BYTES["bf16"]
    return partition_params * DTYPE_BYTES["fp32"]


FP16_STEP_BYTES_PER_PARAM = 2 * DTYPE_BYTES["fp32"]
"""FP16_Optimizer's step (fp16/fused_optimizer.py step): each group's gradients are cast to fp32
one by one (``p.grad.to(data_type)``) and then flattened into a new fp32 buffer, so the casts and
the flat copy (4 + 4 bytes a parameter) are held at once; the model-dtype ``.grad`` of the group
is freed only after. The weight-decay group holds nearly all parameters, so the stage's count
is used."""


def placer_wrapper(zero_stage: int, pp: int) -> Wrapper:
    """The wrapper a DeepSpeed plan of placer runs: placer.dialects.deepspeed writes ``bf16:
    {enabled: true}``, ``zero_optimization.stage`` = the layout's and ``data_types.
    grad_accum_dtype`` = the dtype this wrapper then accumulates in (bf16, the same as unset),
    and pp > 1 runs the pipeline engine (release 0.19, the deepspeed@0.19 stack)."""
    return optimizer_wrapper(zero_stage, "bf16", pipeline=pp > 1)
