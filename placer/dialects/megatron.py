"""Megatron-LM's command line: the flags placer writes and reads, and the rules of each release.

Flag names are those of Megatron-LM's ``megatron/training/arguments.py`` (docs/sources.md 6.2).
The megatron-core wheel holds ``megatron/core`` only, not ``training/arguments.py``, so the
argument rules placer relies on are written here as placer's own version rules, each citing the
line of ``arguments.py`` it was read from (NVIDIA/Megatron-LM tags ``core_v0.13.1`` ea651a3,
``core_v0.14.0`` 23e00ed, ``core_v0.15.3`` 309ffca, ``core_v0.16.1`` 55ac708).
"""

from __future__ import annotations

from placer.cost.stack_options import job_options
from placer.dialects.base import (
    OrderFit,
    Placed,
    RankOrder,
    Refusal,
    Target,
    order_fit,
    pipeline_split,
    version_key,
)
from placer.spec import Model
from placer.spec.stack import load_stack

TARGET = Target("megatron", "Megatron-LM", ("0.13", "0.14", "0.15", "0.16"), "0.16",
                "megatron-core")
FILE = "megatron_args.sh"

# Megatron's two rank orders (megatron/training/initialize.py passes order='tp-cp-ep-dp-pp', or
# 'tp-cp-ep-pp-dp' with --use-tp-pp-dp-mapping; docs/sources.md 6.1).
TP_PP_DP_FLAG = "--use-tp-pp-dp-mapping"
ORDERS = (RankOrder("tp-cp-ep-dp-pp"), RankOrder("tp-cp-ep-pp-dp", TP_PP_DP_FLAG))

# Names the readers need: flag (without --) -> setting key.
INT_FLAGS = {
    "tensor-model-parallel-size": "tp",
    "pipeline-model-parallel-size": "pp",
    "context-parallel-size": "cp",
    "expert-model-parallel-size": "ep",
    "expert-tensor-parallel-size": "etp",
    "num-virtual-stages-per-pipeline-rank": "vpp",
    "virtual-pipeline-model-parallel-size": "vpp",
    "num-layers-per-virtual-pipeline-stage": "layers_per_virtual_stage",
    "decoder-first-pipeline-num-layers": "first_stage_layers",
    "decoder-last-pipeline-num-layers": "last_stage_layers",
    "micro-batch-size": "micro_batch_size",
    "global-batch-size": "global_batch_size",
    "seq-length": "seq_len",
    "num-layers": "num_layers",
    "hidden-size": "hidden_size",
    "num-attention-heads": "num_attention_heads",
    "ffn-hidden-size": "ffn_hidden_size",
    "num-query-groups": "num_query_groups",
    "kv-channels": "head_dim",
    "num-experts": "num_experts",
    "moe-router-topk": "moe_topk",
    "moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "moe-shared-expert-intermediate-size": "shared_expert_ffn_hidden_size",
    "padded-vocab-size": "padded_vocab_size",
    "vocab-size": "vocab_size",
    "max-position-embeddings": "max_position_embeddings",
    # multi-head latent attention (mla_dests)
    "q-lora-rank": "q_lora_rank",
    "kv-lora-rank": "kv_lora_rank",
    "qk-head-dim": "qk_head_dim",
    "qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "v-head-dim": "v_head_dim",
}
CHOICE_FLAGS = {"recompute-granularity": "recompute",
                "data-parallel-sharding-strategy": "sharding_strategy",
                "ckpt-format": "ckpt_format"}
BOOL_FLAGS = {
    "sequence-parallel": "sequence_parallel",
    TP_PP_DP_FLAG.removeprefix("--"): "tp_pp_dp_mapping",
    "swiglu": "swiglu",
    "group-query-attention": "group_query_attention",
    "use-distributed-optimizer": "distributed_optimizer",
    "use-torch-fsdp2": "fsdp",
    "use-megatron-fsdp": "fsdp",
    "untie-embeddings-and-output-weights": "untie",
    "recompute-activations": "recompute_activations",
    "multi-latent-attention": "multi_latent_attention",
    "qk-layernorm": "qk_layernorm",
}
# Megatron's explicit per-stage layer layout (docs/sources.md 6.2, "Uneven PP").
LAYOUT_FLAG = "pipeline-model-parallel-layout"
# ZeRO stage each --data-parallel-sharding-strategy amounts to (docs/sources.md 6.2).
SHARDING_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
# The Megatron-FSDP strategy written for each ZeRO stage it runs (2 and 3).
FSDP_STRATEGY = {zero: strategy for strategy, zero in SHARDING_ZERO.items() if zero >= 2}
# Megatron-FSDP with full sharding (ZeRO-3) checkpoints only in this format: core_v0.14.0
# arguments.py L638, core_v0.15.3 L718, core_v0.16.1 L690 ("Megatron FSDP only supports
# fsdp_dtensor checkpoint format"); the format is a --ckpt-format choice from 0.14.0 on.
FSDP_CKPT_FORMAT = "fsdp_dtensor"
# --fp8-recipe's choices (default delayed), Megatron-LM core_v0.16.1 megatron/training/
# arguments.py _add_transformer_engine_args; newer releases add "custom" (a user recipe class,
# which check reads as FP8 with a note). --fp8-format e4m3 for mxfp8, as Megatron-Bridge's
# bf16_with_mxfp8_mixed recipe sets it (0.3.1 training/mixed_precision.py L249), hybrid else.
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
# --use-megatron-fsdp first appears in core_v0.14.0 (arguments.py L2425); 0.13 has only the
# older --use-custom-fsdp (core_v0.13.1 L646).
FSDP_SINCE = "0.14"


# Multi-head latent attention (Model.mla) as Megatron-LM builds it, by argument dest. The switch
# --multi-latent-attention selects MLATransformerConfig (core_transformer_config_from_args,
# core_v0.16.1 arguments.py L1311; an explicit flag in core_v0.13.1 L1458, core_v0.14.0 L1507,
# core_v0.15.3 L1664, a TransformerConfig field made a flag by L1621 in 0.16). The shapes are
# _add_mla_args (core_v0.16.1 L2723-2734): --q-lora-rank (default None: no query compression),
# --kv-lora-rank, --qk-head-dim (the non-rotary part of the query/key head),
# --qk-pos-emb-head-dim (the rotary part), --v-head-dim. --qk-layernorm makes the latents'
# RMSNorms, which DeepSeek-V2/V3 and Kimi-K2 have (q_a_layernorm, kv_a_layernorm): megatron-core
# gpt_layer_specs.py builds linear_q_up_proj/linear_kv_up_proj as layer-norm linears only with it.
# NVIDIA's DeepSeek-V3 script passes the same seven (Megatron-LM@55ac708 docs/discussions/
# megatron-fsdp-user-guide/example-scripts/sbatch_mfsdp_deepseek_v3.sh). Rotary settings stay
# the user's: --rope-type unset takes MLATransformerConfig's yarn (arguments.py L1353-1355),
# which rope fusion (on unless --no-rope-fusion) requires (MLATransformerConfig.__post_init__).
MLA_SWITCHES = ("--multi-latent-attention", "--qk-layernorm")


def mla_dests(model: Model) -> dict[str, int | None]:
    """The MLA shapes of ``model`` by Megatron argument dest (empty for other attention)."""
    mla = model.mla
    if mla is None:
        return {}
    return {"q_lora_rank": mla.q_lora_rank, "kv_lora_rank": mla.kv_lora_rank,
            "qk_head_dim": model.attention_head_dim - mla.qk_rope_head_dim,
            "qk_pos_emb_head_dim": mla.qk_rope_head_dim, "v_head_dim": mla.v_head_dim}


def mla_args(model: Model) -> list[tuple[str, ...]]:
    """``mla_dests`` as flags; a null q_lora_rank is Megatron's default (no flag)."""
    dests = mla_dests(model)
    if not dests:
        return []
    return [*((flag,) for flag in MLA_SWITCHES),
            *(("--" + dest.replace("_", "-"), str(value)) for dest, value in dests.items()
              if value is not None)]


def fit(placed: Placed) -> OrderFit:
    return order_fit(placed, ORDERS, "Megatron-LM")


# Pipeline schedules Megatron-LM's training loop runs: 1F1B, and interleaved 1F1B with
# virtual stages (megatron/core/pipeline_parallel/schedules.py get_forward_backward_func).
SCHEDULES = ("1f1b", "interleaved")
# megatron-core asserts ETP 1 for an MoE model with linear biases ("Bias in Moe is only supported
# when ETP==1": core_v0.15.3 transformer_config.py L1301-1304, core_v0.16.1 L1588-1591). The rule
# is the megatron-core stack's, by this id.
MOE_BIAS_RULE = "moe-bias-needs-etp-1"
# Grouped-GEMM experts (Transformer Engine's TEGroupedMLP, which the TE layer spec builds with
# --moe-grouped-gemm) take linear biases from core_v0.15.3 on (moe/experts.py L781, L801); before,
# TEGroupedMLP asserts add_bias_linear False ("bias not supported in TEGroupedMLP yet": core_v0.13.1
# L681-683, core_v0.14.0 L761-763), at any ETP. SequentialMLP (no grouped GEMM) takes them.
MOE_BIAS_GROUPED_SINCE = "0.15"


def refusals(placed: Placed, version: str) -> list[Refusal]:
    """What ``version`` rejects in this plan (an empty list: the flags run as written)."""
    layout = placed.layout
    out: list[str] = []
    if layout.zero_stage >= 2 and version_key(version) < version_key(FSDP_SINCE):
        out.append(f"has no --use-megatron-fsdp for zero={layout.zero_stage} (added in "
                   "core_v0.14.0, arguments.py L2425); use --framework-version megatron=0.14 or "
                   "newer, or zero <= 1")
    if layout.pp > 1 and layout.pipeline_schedule not in SCHEDULES:
        out.append(f"runs the {'/'.join(SCHEDULES)} pipeline schedules only (schedules.py "
                   f"get_forward_backward_func); the plan uses {layout.pipeline_schedule}")
    recipe = placed.plan.job.runtime.fp8_recipe
    if placed.plan.job.precision == "fp8" and recipe is not None and recipe not in FP8_RECIPES:
        out.append(f"has no --fp8-recipe {recipe} (its choices: {', '.join(FP8_RECIPES)}; "
                   "arguments.py _add_transformer_engine_args); use one of them")
    if layout.recompute == "op":
        out.append("has no per-op selective recomputation (recompute=op is torchtitan's); use "
                   "recompute=selective with --recompute-modules")
    model = placed.plan.model
    bias = load_stack(TARGET.package).rule(MOE_BIAS_RULE)
    if model.moe is not None and bias.applies(layout, model):
        out.append(f"refuses etp={layout.etp} for {model.name}, whose linears carry biases "
                   f"(stack rule {bias.id}: {bias.why})")
    elif (model.moe is not None and model.linear_bias and job_options(placed.plan.job).
          moe_grouped_gemm and version_key(version) < version_key(MOE_BIAS_GROUPED_SINCE)):
        out.append(f"has no biases in grouped-GEMM experts, which {model.name}'s linears carry "
                   "(TEGroupedMLP asserts add_bias_linear False, moe/experts.py core_v0.14.0 "
                   "L761-763); use --framework-version megatron=0.15 or newer, or the job's "
                   "runtime moe_grouped_gemm: false")
    return [Refusal(FILE, TARGET, version, reason) for reason in out]


# The job's runtime settings as Megatron-LM core_v0.16.1 reads them (NVIDIA/Megatron-LM@
# 55ac7082517c3878ae653c07c09c534b8aed49f6 megatron/training/arguments.py): --overlap-grad-reduce
# (L2243) and --overlap-param-gather (L2264) default off, and the latter needs the distributed
# optimizer or Megatron-FSDP and --overlap-grad-reduce (L597-603); --grad-reduce-in-bf16 (L2178);
# --fp8-param-gather (L1398) needs the distributed optimizer or an FSDP (L655-657);
# --tp-comm-overlap needs --sequence-parallel (L915-916) and Transformer Engine's userbuffers;
# --moe-token-dispatcher-type (default allgather) and --overlap-moe-expert-parallel-comm are
# TransformerConfig fields made flags (L1621; megatron/core/transformer/transformer_config.py
# L675, model_parallel_config.py L264), the latter checked in TransformerConfig.__post_init__
# (L1852-1890: EP > 1, alltoall/flex, no full recomputation, virtual stages under PP, bf16).
RUNTIME_FLAGS = {"overlap_grad_reduce": "--overlap-grad-reduce",
                 "overlap_param_gather": "--overlap-param-gather",
                 "tp_comm_overlap": "--tp-comm-overlap",
                 "overlap_moe_expert_parallel_comm": "--overlap-moe-expert-parallel-comm",
                 "moe_token_dispatcher_type": "--moe-token-dispatcher-type",
                 "grad_reduce_in_bf16": "--grad-reduce-in-bf16",
                 "fp8_param_gather": "--fp8-param-gather"}


def runtime_settings(placed: Placed) -> tuple[dict[str, object], list[str]]:
    """The runtime settings the cost model priced this candidate with (its job on its stack,
    ``placer.cost.stack_options.job_options``), by Megatron argument dest, only those on; and
    one note for each it priced that Megatron cannot run with this layout (the estimate assumes
    what the launch will not do)."""
    layout, plan = placed.layout, placed.plan
    options = job_options(plan.job)
    out: dict[str, object] = {}
    notes: list[str] = []
    sharded = layout.zero_stage >= 1  # distributed optimizer (1) or Megatron-FSDP (2, 3)
    if options.dp_comm_overlap:
        out["overlap_grad_reduce"] = True
    if options.param_gather_overlap and sharded:
        if options.dp_comm_overlap:
            out["overlap_param_gather"] = True
        else:
            notes.append("The estimate overlaps the parameter all-gather, but Megatron runs "
                         "--overlap-param-gather only with --overlap-grad-reduce, which the "
                         "job's runtime has off: not written, so the launch gathers unhidden.")
    if options.tp_comm_overlap and layout.tp > 1:
        if layout.sequence_parallel:
            out["tp_comm_overlap"] = True
            notes.append("--tp-comm-overlap needs Transformer Engine (userbuffers) and "
                         "--transformer-impl transformer_engine (Megatron's default).")
        else:
            notes.append("The estimate overlaps TP communication with GEMMs, but Megatron's "
                         "--tp-comm-overlap needs --sequence-parallel, which the layout has off: "
                         "not written, so the launch runs TP communication unhidden.")
    if plan.model.moe is not None:
        out["moe_token_dispatcher_type"] = options.moe_dispatcher
        if options.ep_comm_overlap and layout.ep > 1:
            blockers = [why for bad, why in (
                (options.moe_dispatcher not in ("alltoall", "flex"),
                 f"the {options.moe_dispatcher} dispatcher"),
                (layout.recompute == "full", "full recomputation"),
                (layout.pp > 1 and layout.vpp <= 1, "PP without virtual stages")) if bad]
            if blockers:
                notes.append("The estimate overlaps the MoE all-to-all, but Megatron refuses "
                             "--overlap-moe-expert-parallel-comm with " + ", ".join(blockers)
                             + ": not written, so the launch dispatches unhidden.")
            else:
                out["overlap_moe_expert_parallel_comm"] = True
    if plan.job.optimizer.grad_bytes == 2:
        out["grad_reduce_in_bf16"] = True
    if plan.job.runtime.fp8_param_gather:
        if sharded:
            out["fp8_param_gather"] = True
        else:
            notes.append("The estimate keeps FP8 weights (fp8_param_gather), but Megatron's "
                         "--fp8-param-gather needs the distributed optimizer or an FSDP (zero >= "
                         "1): not written, so the launch keeps bf16 weights (more memory).")
    if options.compiled_layers or options.compiled_loss:
        notes.append("The estimate torch.compiles the model (runtime.torch_compile on the job's "
                     "stack), which Megatron-LM does not do to its layers or loss: the launch "
                     "keeps what eager code keeps (more activation and loss memory).")
    return out, notes


def runtime_args(runtime: dict[str, object]) -> list[tuple[str, ...]]:
    """``runtime_settings``' settings as Megatron-LM flags."""
    return [(RUNTIME_FLAGS[dest],) if value is True else (RUNTIME_FLAGS[dest], str(value))
            for dest, value in runtime.items()]


def args(placed: Placed, runtime: dict[str, object]) -> list[tuple[str, ...]]:
    """Megatron-LM flags as (flag, value...) tuples, in a stable order (docs/sources.md 6.2);
    ``runtime`` is ``runtime_settings(placed)``'s settings (the caller also writes its notes)."""
    layout, plan = placed.layout, placed.plan
    out: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(layout.tp)),
        ("--pipeline-model-parallel-size", str(layout.pp)),
    ]
    uneven = uneven_pp_args(placed)
    if layout.vpp > 1 and not any(flag == "--" + LAYOUT_FLAG for flag, *_ in uneven):
        # At most one of the virtual-stage flags and the layout (arguments.py L504-512).
        out.append(("--num-virtual-stages-per-pipeline-rank", str(layout.vpp)))
    out += uneven
    out.append(("--context-parallel-size", str(layout.cp)))
    if plan.model.moe is not None:
        out += [("--num-experts", str(plan.model.moe.num_experts)),
                ("--expert-model-parallel-size", str(layout.ep)),
                ("--expert-tensor-parallel-size", str(layout.etp))]
    out += mla_args(plan.model)
    if layout.sequence_parallel:
        out.append(("--sequence-parallel",))
    out += [("--micro-batch-size", str(layout.micro_batch_size)),
            ("--global-batch-size", str(plan.job.global_batch_size)),
            ("--seq-length", str(plan.job.seq_len))]
    # --recompute-modules, --cpu-offloading-num-layers, --account-for-*-in-pipeline-split are
    # TransformerConfig fields made flags by arguments.py L1621 (ArgumentGroupFactory).
    if layout.recompute == "selective":
        out.append(("--recompute-granularity", "selective"))
        if layout.recompute_modules:
            out.append(("--recompute-modules", *layout.recompute_modules))
    elif layout.recompute == "full":
        if layout.recompute_layers:
            out += [("--recompute-granularity", "full"), ("--recompute-method", "block"),
                    ("--recompute-num-layers", str(layout.recompute_layers))]
        else:
            out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                    ("--recompute-num-layers", "1")]
    if layout.offload_layers:
        out.append(("--cpu-offloading-num-layers", str(layout.offload_layers)))
    if layout.zero_stage >= 2:
        # Megatron-FSDP = ZeRO-2/3 (Megatron-Core FSDP user guide flags; the stack's zero_stages):
        # optim_grads shards gradients and optimizer state and reduce-scatters every backward,
        # optim_grads_params the parameters too (megatron_fsdp.py, core_v0.16.1); it needs the
        # fsdp_dtensor checkpoint format (FSDP_CKPT_FORMAT).
        out += [("--use-megatron-fsdp",),
                ("--data-parallel-sharding-strategy", FSDP_STRATEGY[layout.zero_stage]),
                ("--ckpt-format", FSDP_CKPT_FORMAT),
                ("--no-gradient-accumulation-fusion",), ("--use-distributed-optimizer",)]
    elif layout.zero_stage >= 1:
        out.append(("--use-distributed-optimizer",))
    if layout.zero_stage >= 1 and layout.zero_replicas > 1:
        # HSDP: the optimizer state is sharded within dp_shard ranks and replicated across
        # the rest (arguments.py L2333 --num-distributed-optimizer-instances).
        out.append(("--num-distributed-optimizer-instances", str(layout.zero_replicas)))
    out.append(("--bf16",))
    if plan.job.precision == "fp8":
        recipe = plan.job.runtime.fp8_recipe
        out.append(("--fp8-format", "e4m3" if recipe == "mxfp8" else "hybrid"))
        if recipe is not None:
            out.append(("--fp8-recipe", recipe))
    out += runtime_args(runtime)
    flag = fit(placed).flag
    if flag:
        out.append((flag,))
    return out


def uneven_pp(placed: Placed) -> dict[str, object]:
    """The plan's uneven pipeline split (conventions.md 6.2, "Uneven PP"), by argument dest.

    First/last-stage counts when the middle stages are even; otherwise an explicit layout with
    one ``|``-separated segment per stage (E = embedding, t = transformer layer, L = loss).
    With virtual stages the split is not expressed (see ``uneven_note``).
    """
    layout = placed.layout
    if layout.pp_layout:
        return {"pipeline_model_parallel_layout": layout.pp_layout}
    split = pipeline_split(placed)
    if len(set(split.chunks)) == 1 and not (split.embedding_in_split or split.loss_in_split):
        return {}
    if layout.vpp > 1 or split.embedding_in_split or split.loss_in_split:
        # Any split, embedding and loss placed explicitly: one segment per virtual stage.
        return {"pipeline_model_parallel_layout": split.megatron_layout}
    stages = list(split.chunks)
    middle = stages[1:-1]
    if len(set(middle)) <= 1:
        even = middle[0] if middle else None
        out: dict[str, object] = {}
        if stages[0] != even:
            out["decoder_first_pipeline_num_layers"] = stages[0]
        if stages[-1] != even:
            out["decoder_last_pipeline_num_layers"] = stages[-1]
        return out
    return {"pipeline_model_parallel_layout": split.megatron_layout}


def uneven_pp_args(placed: Placed) -> list[tuple[str, ...]]:
    """``uneven_pp`` as Megatron-LM flags."""
    return [("--" + dest.replace("_", "-"), str(value))
            for dest, value in uneven_pp(placed).items()]


def uneven_note(placed: Placed) -> str | None:
    split = pipeline_split(placed)
    if len(set(split.chunks)) == 1:
        return None
    return (f"Uneven pipeline split from the plan: {list(split.chunks)} decoder layers per "
            "virtual stage.")
