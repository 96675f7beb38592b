"""DeepSpeed's JSON config: the keys placer writes and reads, and what DeepSpeed checks.

``DeepSpeedConfig`` (deepspeed/runtime/config.py, 0.19.8) asserts ``train_batch_size ==
train_micro_batch_size_per_gpu x gradient_accumulation_steps x world_size``, where world_size is
the mpu's data-parallel size when an mpu is passed and the whole world otherwise. A plan with tp,
pp or cp > 1 has a data-parallel size below the world, so a config that states
``train_batch_size`` passes with an mpu and fails in a plain ``deepspeed.initialize``. For those
plans placer leaves ``train_batch_size`` out: DeepSpeed derives it from the other two and the
data-parallel size it sees, so the file is accepted both ways and every rank runs the plan's
micro-batches (docs/sources.md 7.1).

``data_types.grad_accum_dtype`` (deepspeed/runtime/constants.py, read by config.py; unset: the
model's dtype, engine.py ``get_data_types``) is written as the gradient dtype the plan's memory
priced: on the deepspeed stack the dtype DeepSpeed's wrapper for this file accumulates in (bf16,
``placer.cost.memory.deepspeed_engine_memory``), elsewhere the job's ``optimizer.grad_bytes``
(fp32 main gradients by default). Where DeepSpeed refuses that dtype with bf16 weights (fp32 at
ZeRO stage 0: ``placer.cost.deepspeed_optimizer.optimizer_wrapper``) it is left out, and the
README says the launch accumulates in bf16.
"""

from __future__ import annotations

import json

from placer.cost.deepspeed_optimizer import DTYPE_BYTES, Precision, optimizer_wrapper
from placer.cost.memory import deepspeed_engine_memory
from placer.cost.stack_options import job_options
from placer.dialects.base import Placed, Refusal, Target

TARGET = Target("deepspeed", "DeepSpeed", ("0.16", "0.17", "0.18", "0.19"), "0.19", "deepspeed")
FILE = "deepspeed.json"
BATCH_KEY = "train_batch_size"
MICRO_KEY = "train_micro_batch_size_per_gpu"
ACCUMULATION_KEY = "gradient_accumulation_steps"
ZERO_KEY = "zero_optimization"
DATA_TYPES_KEY = "data_types"
GRAD_ACCUM_KEY = "grad_accum_dtype"
KEYS = (BATCH_KEY, MICRO_KEY, ACCUMULATION_KEY, ZERO_KEY)
# placer's file runs bf16 weights ("bf16": {"enabled": true}); these are the accumulation dtypes
# DeepSpeed can be told, by the bytes per gradient the estimate priced.
GRAD_DTYPES: dict[int, Precision] = {DTYPE_BYTES["fp32"]: "fp32", DTYPE_BYTES["bf16"]: "bf16"}
# AutoTP training: {"tensor_parallel": {"autotp_size": N}} (DeepSpeed >= 0.16.4; engine.py
# autotp_size()); "tp_size" is its older spelling.
TP_SECTION = "tensor_parallel"
TP_KEYS = ("autotp_size", "tp_size")
# AutoTP shards each layer over consecutive ranks, with data parallelism outside it.
ORDER = ("tp", "cp", "dp", "pp")


def needs_mpu(placed: Placed) -> bool:
    """True when DeepSpeed's data-parallel size is not the world: tp, pp or cp > 1."""
    layout = placed.layout
    return layout.tp * layout.pp * layout.cp > 1


def refusals(placed: Placed, version: str) -> list[Refusal]:
    layout = placed.layout
    if layout.pp > 1 and layout.zero_stage >= 2:
        # deepspeed/runtime/pipe/engine.py L77 (0.19.8) asserts the stage is below 2
        # ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism").
        return [Refusal(FILE, TARGET, version,
                        f"pipeline engine supports ZeRO stage 0 or 1 only; the plan has "
                        f"zero={layout.zero_stage} with pp={layout.pp}")]
    return []


def grad_accum_dtype(placed: Placed) -> tuple[Precision | None, str | None]:
    """The plan's gradient dtype as ``data_types.grad_accum_dtype`` (module docstring), or None
    and the note saying why it is left out."""
    layout, job = placed.layout, placed.plan.job
    options = job_options(job)
    priced = (deepspeed_engine_memory(job, layout, options)[0] if options.deepspeed_engine
              else job).optimizer.grad_bytes
    dtype = GRAD_DTYPES.get(priced)
    if dtype is None:
        return None, (f"The estimate keeps {priced}-byte gradients, which DeepSpeed's "
                      f"{DATA_TYPES_KEY}.{GRAD_ACCUM_KEY} cannot say: left out, so the launch "
                      "accumulates gradients in bf16.")
    try:
        optimizer_wrapper(layout.zero_stage, "bf16", pipeline=layout.pp > 1, grad_accum_dtype=dtype)
    except ValueError as exc:
        return None, (f"The estimate keeps {dtype} gradients, but {exc}: "
                      f"{DATA_TYPES_KEY}.{GRAD_ACCUM_KEY} is left out, so the launch "
                      "accumulates gradients in bf16.")
    return dtype, None


def config(placed: Placed) -> dict[str, object]:
    layout, job = placed.layout, placed.plan.job
    zero: dict[str, object] = {"stage": layout.zero_stage}
    if layout.zero_stage > 0:
        zero.update({"overlap_comm": True, "contiguous_gradients": True})
    out: dict[str, object] = {}
    if not needs_mpu(placed):
        out[BATCH_KEY] = job.global_batch_size
    out.update({
        MICRO_KEY: layout.micro_batch_size,
        ACCUMULATION_KEY: layout.num_microbatches(job.global_batch_size),
        "bf16": {"enabled": True},
        ZERO_KEY: zero,
    })
    dtype = grad_accum_dtype(placed)[0]
    if dtype is not None:
        out[DATA_TYPES_KEY] = {GRAD_ACCUM_KEY: dtype}
    return out


def render_json(placed: Placed) -> str:
    return json.dumps(config(placed), indent=2) + "\n"


def notes(placed: Placed) -> list[str]:
    """What the DeepSpeed JSON cannot say (JSON has no comments; these go in the README)."""
    layout, job = placed.layout, placed.plan.job
    micro, steps = layout.micro_batch_size, layout.num_microbatches(job.global_batch_size)
    if needs_mpu(placed):
        out = [f"train_batch_size is left out: the plan's data-parallel size is {layout.dp} of "
               f"{layout.num_gpus} ranks, and DeepSpeed derives it as {micro} x {steps} x the "
               f"data-parallel size it sees, = {job.global_batch_size} with an mpu "
               "(Megatron-DeepSpeed's, or PipelineModule's topology when pp > 1). Without an "
               "mpu DeepSpeed treats every rank as data-parallel: the model's tp/pp/cp "
               "sharding must then come from DeepSpeed itself (AutoTP: "
               f'"tensor_parallel": {{"autotp_size": {layout.tp}}}) or from placer_mesh\'s '
               "groups."]
    else:
        out = [f"train_batch_size {job.global_batch_size} = {micro} x {steps} x {layout.dp} "
               "data-parallel ranks; no mpu is needed."]
    left_out = grad_accum_dtype(placed)[1]
    if left_out is not None:
        out.append(left_out)
    out.append("DeepSpeed has no key for the rank order; TP/PP groups come from the mpu "
               "(Megatron order) or from placer_mesh.")
    if job.precision == "fp8":
        # DeepSpeed 0.19.8's config (deepspeed/runtime/constants.py) has bf16, fp16 and
        # torch_autocast sections and no FP8 one: FP8 GEMMs come from the model's own layers.
        out.append("The estimate runs FP8 GEMMs, which deepspeed.json cannot switch on "
                   "(DeepSpeed's config has bf16, fp16 and torch_autocast, no FP8): the model's "
                   "linear layers must run FP8 themselves (e.g. Transformer Engine's "
                   "fp8_autocast), or the launch trains in bf16.")
    return out
