"""Megatron-Bridge recipe overrides: the plan's settings as a ConfigContainer YAML.

NVIDIA's current recipes run through Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge), whose
``ConfigContainer`` holds dataclass sections (``model``: a ``GPTModelProvider``, a megatron-core
``TransformerConfig``; ``train``; ``ddp``; ``optimizer``; ``dataset``; ``checkpoint``; ``dist``)
and whose recipe scripts merge a YAML file of overrides (OmegaConf) into a recipe's config.
Field names are those of megatron-bridge 0.3.1 ``megatron/bridge/training/config.py`` and of
megatron-core's configs. Rules from ``ConfigContainer.validate`` (config.py L1465-1478, 0.3.1):
Megatron-FSDP refuses ``dist.use_tp_pp_dp_mapping`` and saves/loads only ``fsdp_dtensor``
checkpoints.
"""

from __future__ import annotations

import yaml

from placer.dialects import megatron
from placer.dialects.base import Placed, Refusal, Target

TARGET = Target("megatron-bridge", "Megatron-Bridge", ("0.3",), "0.3", "megatron-bridge")
FILE = "megatron_bridge_overrides.yaml"
# Megatron-LM argument dest -> GPTModelProvider field (arguments.py
# core_transformer_config_from_args L1329-1330 renames these two).
_MODEL_RENAMES = {"decoder_first_pipeline_num_layers": "num_layers_in_first_pipeline_stage",
                  "decoder_last_pipeline_num_layers": "num_layers_in_last_pipeline_stage"}


def refusals(placed: Placed, version: str) -> list[Refusal]:
    """Bridge's own rule, and what the megatron-core it runs refuses (same schedules,
    recomputation and FSDP as Megatron-LM's training loop)."""
    out = [Refusal(FILE, TARGET, version, r.reason)
           for r in megatron.refusals(placed, megatron.TARGET.default)]
    if placed.layout.zero_stage == 3 and megatron.fit(placed).flag == megatron.TP_PP_DP_FLAG:
        out.append(Refusal(FILE, TARGET, version,
                           "does not support use_tp_pp_dp_mapping with Megatron-FSDP (zero=3; "
                           "ConfigContainer.validate); the plan needs the tp-pp-dp rank order"))
    return out


def overrides(placed: Placed) -> dict[str, object]:
    layout, plan = placed.layout, placed.plan
    model: dict[str, object] = {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp if layout.vpp > 1 else None,
        "context_parallel_size": layout.cp,
        "sequence_parallel": layout.sequence_parallel,
        "seq_length": plan.job.seq_len,
    }
    model.update({_MODEL_RENAMES.get(k, k): v for k, v in megatron.uneven_pp(placed).items()})
    if "pipeline_model_parallel_layout" in model:
        model["virtual_pipeline_model_parallel_size"] = None  # the layout gives it
    if plan.model.moe is not None:
        model.update(expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp)
    if plan.model.mla is not None:
        # MLATransformerConfig's fields (megatron-core, Bridge's MLAModelProvider /
        # DeepSeekV3ModelProvider extend it), as Megatron-LM's flags fill them
        # (megatron.mla_dests); q_lora_rank is written even when null, since the field's own
        # default is 512, not None.
        model.update(multi_latent_attention=True, qk_layernorm=True,
                     **megatron.mla_dests(plan.model))
    if layout.recompute == "selective":
        model["recompute_granularity"] = "selective"
        if layout.recompute_modules:
            model["recompute_modules"] = list(layout.recompute_modules)
    elif layout.recompute == "full":
        model.update(recompute_granularity="full",
                     recompute_method="block" if layout.recompute_layers else "uniform",
                     recompute_num_layers=layout.recompute_layers or 1)
    if layout.offload_layers:
        model["cpu_offloading_num_layers"] = layout.offload_layers
    fsdp = layout.zero_stage >= 2  # Megatron-FSDP: optim_grads (ZeRO-2), optim_grads_params
    distributed = layout.zero_stage >= 1
    out: dict[str, object] = {
        "model": model,
        "train": {"micro_batch_size": layout.micro_batch_size,
                  "global_batch_size": plan.job.global_batch_size},
        "dataset": {"sequence_length": plan.job.seq_len},
        "ddp": {"use_distributed_optimizer": distributed, "use_megatron_fsdp": fsdp,
                "data_parallel_sharding_strategy": megatron.FSDP_STRATEGY[layout.zero_stage]
                if fsdp else "no_shard"},
        "optimizer": {"use_distributed_optimizer": distributed},
        "dist": {"use_megatron_fsdp": fsdp,
                 "use_tp_pp_dp_mapping": megatron.fit(placed).flag == megatron.TP_PP_DP_FLAG},
    }
    # A named MixedPrecisionConfig recipe (training/mixed_precision.py): bf16_mixed sets bf16,
    # params_dtype and pipeline_dtype = bfloat16 (L172-182); PP needs pipeline_dtype.
    out["mixed_precision"] = ("bf16_with_fp8_delayed_scaling_mixed"
                              if plan.job.precision == "fp8" else "bf16_mixed")
    if distributed and layout.zero_replicas > 1:
        out["ddp"]["num_distributed_optimizer_instances"] = layout.zero_replicas  # type: ignore[index]
    if fsdp:
        out["checkpoint"] = {"ckpt_format": megatron.FSDP_CKPT_FORMAT}
        model["gradient_accumulation_fusion"] = False
    runtime = megatron.runtime_settings(placed)[0]
    if "moe_token_dispatcher_type" in runtime:
        model["moe_token_dispatcher_type"] = runtime["moe_token_dispatcher_type"]
    # The overlaps go both into ddp / model (megatron-core's DistributedDataParallelConfig and
    # TransformerConfig fields) and into comm_overlap (Bridge 0.3.1 training/comm_overlap.py
    # CommOverlapConfig L381-395, whose setup() rewrites ddp's and the model's overlap fields
    # from the user's values when a recipe has the section: config.py L1870-1872).
    overlap = {key: bool(runtime.get(key)) for key in _COMM_OVERLAP}
    out["ddp"].update(overlap_grad_reduce=overlap["overlap_grad_reduce"],  # type: ignore[union-attr]
                      overlap_param_gather=overlap["overlap_param_gather"])
    if plan.model.moe is not None:
        model["overlap_moe_expert_parallel_comm"] = overlap["overlap_moe_expert_parallel_comm"]
    out["comm_overlap"] = overlap
    return out


# CommOverlapConfig fields placer sets (tp_comm_overlap has no default there, so it is written).
_COMM_OVERLAP = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather",
                 "overlap_moe_expert_parallel_comm")


def recipe_notes(placed: Placed) -> list[str]:
    """What the named mixed-precision recipe overrides: its setup() writes grad_reduce_in_fp32
    (default True) and fp8_param_gather (default False) into ddp and the model (Bridge 0.3.1
    training/mixed_precision.py L42, L56, L100-122), so a job priced with bf16 gradient reduction
    or FP8 weights needs a recipe that sets them."""
    runtime, notes = megatron.runtime_settings(placed)
    if runtime.get("grad_reduce_in_bf16"):
        notes.append("The estimate reduces gradients in bf16, but the mixed_precision recipe "
                     "below keeps grad_reduce_in_fp32: true: use a recipe with "
                     "grad_reduce_in_fp32 = False, or the launch reduces in fp32.")
    if runtime.get("fp8_param_gather"):
        notes.append("The estimate keeps FP8 weights, but the mixed_precision recipe below has "
                     "fp8_param_gather: false: use a recipe with fp8_param_gather = True, or the "
                     "launch keeps bf16 weights.")
    return notes


def render_yaml(placed: Placed, notes: list[str]) -> str:
    body = yaml.safe_dump(overrides(placed), sort_keys=False, default_flow_style=False,
                          width=100)
    return "".join(f"# {n}\n" if n else "#\n" for n in notes) + body
