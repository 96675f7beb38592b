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


# Bridge 0.3.1's named mixed-precision recipes (training/mixed_precision.py, @register) and the
# FP8 recipe each sets (cfg.fp8_recipe; "nvfp4": cfg.fp4_recipe, an FP4 recipe; None: no FP8).
# tests/test_bridge_mixed_precision.py reads them back from Bridge's own source.
MIXED_PRECISION_RECIPES: dict[str, str | None] = {
    "bf16_mixed": None, "fp16_mixed": None,
    "bf16_with_fp8_delayed_scaling_mixed": "delayed",
    "fp16_with_fp8_delayed_scaling_mixed": "delayed",
    "bf16_with_mxfp8_mixed": "mxfp8", "fp16_with_mxfp8_mixed": "mxfp8",
    "bf16_with_fp8_current_scaling_mixed": "tensorwise",
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": "tensorwise",
    "nanov2_bf16_with_fp8_current_scaling_mixed": "blockwise",
    "fp16_with_fp8_current_scaling_mixed": "tensorwise",
    "bf16_with_fp8_subchannel_scaling_mixed": "blockwise",
    "fp16_with_fp8_subchannel_scaling_mixed": "blockwise",
    "bf16_with_nvfp4_mixed": "nvfp4",
}
# The recipe written for a job's FP8 recipe (None: Megatron's default, delayed scaling). Each
# sets fp8_param_gather = True (L219, L252, L289, L370), and current scaling keeps the first and
# last Transformer layer in BF16 (first_last_layers_bf16, L286-288).
FP8_RECIPE_NAMES: dict[str | None, str] = {
    None: "bf16_with_fp8_delayed_scaling_mixed",
    "delayed": "bf16_with_fp8_delayed_scaling_mixed",
    "tensorwise": "bf16_with_fp8_current_scaling_mixed",
    "blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
}


def mixed_precision_recipe(precision: str, fp8_recipe: str | None) -> str | None:
    """The Bridge recipe name for the job's precision and FP8 recipe; None when Bridge has none
    (megatron.refusals says why)."""
    if precision != "fp8":
        return "bf16_mixed"
    return FP8_RECIPE_NAMES.get(fp8_recipe)


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


def overrides(placed: Placed, runtime: dict[str, object]) -> dict[str, object]:
    """The ConfigContainer sections, with ``runtime`` (``megatron.runtime_settings``)."""
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
    out["mixed_precision"] = mixed_precision_recipe(plan.job.precision,
                                                    plan.job.runtime.fp8_recipe)
    if distributed and layout.zero_replicas > 1:
        out["ddp"]["num_distributed_optimizer_instances"] = layout.zero_replicas  # type: ignore[index]
    if fsdp:
        out["checkpoint"] = {"ckpt_format": megatron.FSDP_CKPT_FORMAT}
        model["gradient_accumulation_fusion"] = False
    if "moe_token_dispatcher_type" in runtime:
        model["moe_token_dispatcher_type"] = runtime["moe_token_dispatcher_type"]
    # The overlaps go both into ddp / model (megatron-core's DistributedDataParallelConfig and
    # TransformerConfig fields) and into comm_overlap (Bridge 0.3.1 training/comm_overlap.py
    # CommOverlapConfig L381-395, whose setup() rewrites ddp's and the model's overlap fields
    # from the user's values: config.py runtime_config_update L1870-1872).
    overlap = {key: bool(runtime.get(key)) for key in _COMM_OVERLAP}
    out["ddp"].update(overlap_grad_reduce=overlap["overlap_grad_reduce"],  # type: ignore[union-attr]
                      overlap_param_gather=overlap["overlap_param_gather"])
    if plan.model.moe is not None:
        model["overlap_moe_expert_parallel_comm"] = overlap["overlap_moe_expert_parallel_comm"]
    out["comm_overlap"] = {"_target_": COMM_OVERLAP_TARGET, "tp_comm_overlap_cfg": None,
                           **overlap}
    return out


# CommOverlapConfig fields placer sets (tp_comm_overlap has no default there, so it is written).
_COMM_OVERLAP = ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather",
                 "overlap_moe_expert_parallel_comm")
# How Bridge 0.3.1 merges the file (docs/sources.md 6.4; training/utils/omegaconf_utils.py
# process_config_with_overrides): the recipe's dataclasses become plain dicts, the YAML is
# OmegaConf-merged into them, and _apply_overrides walks the result: into a section that is a
# dataclass it recurses, but a mapping for a field that is None -- recipes/common.py
# _pretrain_common sets comm_overlap=None, and the Qwen2/3, Qwen3-MoE, GPT-OSS, Gemma and GLM-4.5
# recipes set none -- is set as the plain dict, on which config.py L1373 (set_data_parallel_size)
# fails. A mapping with _target_ is built by utils/instantiate_utils.py instantiate instead, on
# either kind of recipe, from the merged keys: a recipe's own CommOverlapConfig fields are kept, but
# its tp_comm_overlap_cfg (a TransformerLayerTPOverlapCfg, e.g. Llama 3 70B's userbuffers config,
# llama3.py L737-740) arrives as a plain dict, which setup() refuses with TP overlap on
# (dataclasses.asdict, comm_overlap.py L591). So the file sets it to null: Transformer Engine's
# default userbuffers config, as Megatron-LM's --tp-comm-overlap without --tp-comm-overlap-cfg.
COMM_OVERLAP_TARGET = "megatron.bridge.training.comm_overlap.CommOverlapConfig"
COMM_OVERLAP_NOTE = ("comm_overlap has a _target_, so Megatron-Bridge builds a CommOverlapConfig "
                     "from it whether or not the recipe has one (without it, a recipe whose "
                     "comm_overlap is None gets a plain dict and fails).")
TUNED_UB_NOTE = ("tp_comm_overlap_cfg: null is Transformer Engine's default userbuffers config "
                 "(a recipe's tuned one would arrive as a plain dict, which CommOverlapConfig."
                 "setup() refuses); to keep a tuned one, set cfg.comm_overlap.tp_comm_overlap_cfg "
                 "in the recipe script after the merge.")


def recipe_notes(runtime: dict[str, object], recipe: str | None) -> list[str]:
    """How comm_overlap is written (COMM_OVERLAP_TARGET), and what the named mixed-precision
    ``recipe`` overrides: its setup() writes grad_reduce_in_fp32 (default True) and
    fp8_param_gather into ddp and the model (Bridge 0.3.1 training/mixed_precision.py L42, L56,
    L100-122); bf16_mixed leaves fp8_param_gather False, every FP8 recipe sets it True, and
    current scaling keeps the first and last Transformer layer in BF16 (FP8_RECIPE_NAMES).
    ``runtime`` is ``megatron.runtime_settings``'s."""
    notes = [COMM_OVERLAP_NOTE]
    if runtime.get("tp_comm_overlap"):
        notes.append(TUNED_UB_NOTE)
    if runtime.get("grad_reduce_in_bf16"):
        notes.append("The estimate reduces gradients in bf16, but the mixed_precision recipe "
                     "below keeps grad_reduce_in_fp32: true: use a recipe with "
                     "grad_reduce_in_fp32 = False, or the launch reduces in fp32.")
    fp8 = MIXED_PRECISION_RECIPES.get(recipe or "") is not None
    if fp8 and not runtime.get("fp8_param_gather"):
        notes.append(f"{recipe} sets fp8_param_gather = True, which the estimate did not price "
                     "(runtime.fp8_param_gather): the launch keeps FP8 weights, less memory than "
                     "estimated.")
    if recipe == FP8_RECIPE_NAMES["tensorwise"]:
        notes.append(f"{recipe} runs the first and last Transformer layer in BF16 "
                     "(first_last_layers_bf16), which the estimate prices in FP8.")
    return notes


def render_yaml(doc: dict[str, object], notes: list[str]) -> str:
    """``overrides``' sections under the notes, as comment lines."""
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)
    return "".join(f"# {n}\n" if n else "#\n" for n in notes) + body
