"""Framework configs from one placement: Megatron-LM flags, a torchtitan TOML, a DeepSpeed JSON.

Keys are the documented ones (conventions.md 6.2 for Megatron, 7.1 DeepSpeed, 7.2 torchtitan). Each
framework builds its own process groups from consecutive ranks in a fixed order, so each file says
whether that order realises the plan's rank map or, if not, that placer_mesh's groups are needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from placer.launch.rankmap import Placement
from placer.launch.shell import comment_block, quote
from placer.mesh import order_text

# Megatron's two rank orders (conventions.md 6.1): the default, and --use-tp-pp-dp-mapping.
MEGATRON_ORDERS: dict[tuple[str, ...], str | None] = {
    ("tp", "cp", "dp", "pp"): None,
    ("tp", "cp", "pp", "dp"): "--use-tp-pp-dp-mapping",
}
# torchtitan's mesh (pp, dp_replicate, dp_shard, cp, tp), tp innermost (conventions.md 7.2).
TORCHTITAN_ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class OrderFit:
    """Whether a framework's fixed rank order realises the plan's rank map, and how."""

    expressible: bool
    flag: str | None
    explanation: str


def _effective(order: tuple[str, ...], placement: Placement) -> tuple[str, ...]:
    """The order without size-1 dims, which do not change any rank's group."""
    return tuple(d for d in order if placement.grid.sizes[d] > 1)


def _order_fit(placement: Placement, orders: dict[tuple[str, ...], str | None],
               framework: str) -> OrderFit:
    plan_order = _effective(placement.grid.order, placement)
    matches = [(o, flag) for o, flag in orders.items() if _effective(o, placement) == plan_order]
    names = " or ".join(order_text(o) for o in orders)
    if matches and placement.is_identity:
        order, flag = matches[0]
        how = f" (with {flag})" if flag else ""
        return OrderFit(True, flag, f"{framework}'s rank order {order_text(order)}{how} gives "
                        "exactly the plan's groups over torchrun's ranks.")
    if matches:
        reason = ("the plan permutes ranks (not consecutive torchrun ranks in "
                  f"{order_text(placement.grid.order)} order)")
    else:
        reason = f"the plan's order is {order_text(placement.grid.order)}"
    return OrderFit(False, None, (
        f"{framework} cannot express this rank map: it builds its groups from consecutive "
        f"ranks in the order {names}, and {reason}. Either build the groups from placer_mesh "
        "(pm.group('tp'), pm.mesh) and hand them to the framework, or accept the framework's "
        "order, which is not the placement placer estimated."))


def megatron_fit(placement: Placement) -> OrderFit:
    return _order_fit(placement, MEGATRON_ORDERS, "Megatron-LM")


def torchtitan_fit(placement: Placement) -> OrderFit:
    return _order_fit(placement, {TORCHTITAN_ORDER: None}, "torchtitan")


def megatron_args(placement: Placement) -> list[tuple[str, ...]]:
    """Megatron-LM flags as (flag, value...) tuples, in a stable order (conventions.md 6.2)."""
    layout, plan = placement.layout, placement.plan
    args: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(layout.tp)),
        ("--pipeline-model-parallel-size", str(layout.pp)),
    ]
    if layout.vpp > 1:
        args.append(("--num-virtual-stages-per-pipeline-rank", str(layout.vpp)))
    args += _megatron_uneven_pp(placement)
    args.append(("--context-parallel-size", str(layout.cp)))
    if plan.model.moe is not None:
        args += [("--num-experts", str(plan.model.moe.num_experts)),
                 ("--expert-model-parallel-size", str(layout.ep)),
                 ("--expert-tensor-parallel-size", str(layout.etp))]
    if layout.sequence_parallel:
        args.append(("--sequence-parallel",))
    args += [("--micro-batch-size", str(layout.micro_batch_size)),
             ("--global-batch-size", str(plan.job.global_batch_size)),
             ("--seq-length", str(plan.job.seq_len))]
    if layout.recompute == "selective":
        args.append(("--recompute-granularity", "selective"))
    elif layout.recompute == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", "1")]
    if layout.zero_stage == 3:
        # Megatron-FSDP with full sharding = ZeRO-3 (Megatron-Core FSDP user guide flags).
        args += [("--use-megatron-fsdp",),
                 ("--data-parallel-sharding-strategy", "optim_grads_params"),
                 ("--no-gradient-accumulation-fusion",), ("--use-distributed-optimizer",)]
    elif layout.zero_stage >= 1:
        args.append(("--use-distributed-optimizer",))
    args.append(("--bf16",))
    if plan.job.precision == "fp8":
        args.append(("--fp8-format", "hybrid"))
    flag = megatron_fit(placement).flag
    if flag:
        args.append((flag,))
    return args


def _megatron_uneven_pp(placement: Placement) -> list[tuple[str, ...]]:
    """Flags for the plan's uneven pipeline split (conventions.md 6.2, "Uneven PP").

    First/last-stage counts when the middle stages are even; otherwise an explicit layout with
    one ``|``-separated segment per stage (E = embedding, t = transformer layer, L = loss).
    With virtual stages the split is not expressed (see ``_uneven_note``).
    """
    stages = placement.candidate.stage_layers
    if stages is None or len(set(stages)) == 1 or placement.layout.vpp > 1:
        return []
    middle = stages[1:-1]
    if len(set(middle)) <= 1:
        even = middle[0] if middle else None
        flags: list[tuple[str, ...]] = []
        if stages[0] != even:
            flags.append(("--decoder-first-pipeline-num-layers", str(stages[0])))
        if stages[-1] != even:
            flags.append(("--decoder-last-pipeline-num-layers", str(stages[-1])))
        return flags
    return [("--pipeline-model-parallel-layout", "E" + "|".join("t" * n for n in stages) + "L")]


def _uneven_note(placement: Placement) -> str | None:
    stages = placement.candidate.stage_layers
    if stages is None or len(set(stages)) == 1:
        return None
    if placement.layout.vpp > 1:
        return (f"The plan splits layers unevenly over pipeline stages ({stages}) and uses "
                f"vpp={placement.layout.vpp}: give Megatron a --pipeline-model-parallel-layout "
                "with one segment per virtual stage by hand.")
    return f"Uneven pipeline split from the plan: {stages} layers per stage."


def render_megatron_sh(placement: Placement) -> str:
    """A bash array of Megatron flags to source and splice into the training command."""
    fit = megatron_fit(placement)
    layout = placement.layout
    notes = [
        f"Megatron-LM arguments for job {placement.plan.job.name}, layout {layout} "
        "(flag names: Megatron-LM arguments.py, conventions.md 6.2). Use them with launch.sh:",
        "  source megatron_args.sh",
        "  PLACER_SCRIPT=pretrain_gpt.py ./launch.sh \"${MEGATRON_ARGS[@]}\" <model and data "
        "arguments>",
        f"Rank order: {fit.explanation}",
    ]
    uneven = _uneven_note(placement)
    if uneven:
        notes.append(uneven)
    if layout.zero_stage in (1, 2):
        notes.append(f"zero={layout.zero_stage}: Megatron's distributed optimizer shards the "
                     "optimizer state over DP x CP and reduce-scatters gradients.")
    lines = ["# shellcheck shell=bash", *comment_block(notes),
             "# shellcheck disable=SC2034  # read by the script that sources this file",
             "MEGATRON_ARGS=("]
    lines += ["  " + " ".join(quote(part) for part in arg) for arg in megatron_args(placement)]
    lines.append(")")
    return "\n".join(lines) + "\n"


def torchtitan_config(placement: Placement) -> dict[str, dict[str, object]]:
    """torchtitan sections and keys (conventions.md 7.2; torchtitan JobConfig field names)."""
    layout, job = placement.layout, placement.plan.job
    if layout.zero_stage == 0:
        replicate, shard, reshard = layout.dp, 1, "default"
    else:
        replicate, shard = 1, layout.dp
        # torchtitan has no ZeRO-1/2; FSDP that keeps parameters gathered after forward
        # communicates like ZeRO-2 (no re-gather in backward).
        reshard = "default" if layout.zero_stage == 3 else "never"
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": layout.tp,
        "pipeline_parallel_degree": layout.pp,
        "context_parallel_degree": layout.cp,
        "expert_parallel_degree": layout.ep,
    }
    if placement.plan.model.moe is not None:
        parallelism["expert_tensor_parallel_degree"] = layout.etp
    training: dict[str, object] = {"global_batch_size": job.global_batch_size,
                                   "seq_len": job.seq_len}
    if layout.pp > 1:
        # One pipeline schedule runs all microbatches of the step: the local batch is the
        # per-DP-rank share of the global batch, split into microbatches of mbs.
        training["local_batch_size"] = job.global_batch_size // layout.dp
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch_size
        parallelism["pipeline_parallel_schedule"] = ("Interleaved1F1B" if layout.vpp > 1
                                                     else "1F1B")
        stages = placement.candidate.stage_layers
        if stages is not None and len(set(stages)) > 1 and layout.vpp == 1:
            # Each split point names the first layer module of the next stage.
            starts = [sum(stages[:i]) for i in range(1, len(stages))]
            parallelism["pipeline_parallel_split_points"] = [f"layers.{s}" for s in starts]
    else:
        training["local_batch_size"] = layout.micro_batch_size
    checkpoint: dict[str, object] = {"mode": layout.recompute}
    if layout.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    return {
        "job": {"description": f"{job.name} ({layout})"},
        "training": dict(sorted(training.items())),
        "parallelism": parallelism,
        "activation_checkpoint": checkpoint,
    }


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def render_torchtitan_toml(placement: Placement) -> str:
    layout = placement.layout
    fit = torchtitan_fit(placement)
    notes = [
        f"torchtitan settings for job {placement.plan.job.name}, layout {layout}. Merge these "
        "sections into your model's train config (TOML releases up to v0.2.x); with the "
        "dataclass configs of newer releases pass them as --parallelism.<key> <value> and so on.",
        f"Rank order: {fit.explanation}",
    ]
    if layout.zero_stage in (1, 2):
        notes.append(f"zero={layout.zero_stage}: torchtitan has no ZeRO-1/2; FSDP with "
                     "fsdp_reshard_after_forward = \"never\" is the closest (ZeRO-2 traffic).")
    stages = placement.candidate.stage_layers
    if stages is not None and len(set(stages)) > 1:
        notes.append(f"Uneven pipeline split {stages}: "
                     + ("pipeline_parallel_split_points assume torchtitan's layer modules "
                        "are named layers.<i>." if layout.vpp == 1 else
                        "with virtual stages set pipeline_parallel_split_points by hand."))
    if layout.tp > 1 and not layout.sequence_parallel:
        notes.append("The plan has sequence parallelism off, but torchtitan applies it with TP.")
    shard_ep = (1 if layout.zero_stage == 0 else layout.dp) * layout.cp * layout.tp
    if layout.ep > 1 and shard_ep % layout.ep:
        notes.append(f"torchtitan needs expert_parallel_degree to divide data_parallel_shard x "
                     f"cp x tp = {shard_ep}; use zero >= 1 (FSDP) for this layout.")
    lines = comment_block(notes)
    for section, keys in torchtitan_config(placement).items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def deepspeed_config(placement: Placement) -> dict[str, object]:
    """DeepSpeed JSON (conventions.md 7.1): batch = micro x accumulation x data-parallel size."""
    layout, job = placement.layout, placement.plan.job
    zero: dict[str, object] = {"stage": layout.zero_stage}
    if layout.zero_stage > 0:
        zero.update({"overlap_comm": True, "contiguous_gradients": True})
    return {
        "train_batch_size": job.global_batch_size,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.num_microbatches(job.global_batch_size),
        "bf16": {"enabled": True},
        "zero_optimization": zero,
    }


def render_deepspeed_json(placement: Placement) -> str:
    return json.dumps(deepspeed_config(placement), indent=2) + "\n"


def deepspeed_notes(placement: Placement) -> list[str]:
    """What the DeepSpeed JSON cannot say (JSON has no comments; these go in the README)."""
    layout = placement.layout
    notes = [f"train_batch_size = micro batch x gradient_accumulation_steps x data-parallel size "
             f"({layout.dp}); DeepSpeed takes the data-parallel size from the mpu when one is "
             "passed, so pass Megatron-DeepSpeed's mpu when tp, pp or cp > 1."]
    if layout.pp > 1 and layout.zero_stage >= 2:
        notes.append("DeepSpeed's pipeline engine supports ZeRO stage 0 or 1 only; this plan "
                     f"uses zero={layout.zero_stage} with pp={layout.pp}.")
    notes.append("DeepSpeed has no key for the rank order; TP/PP groups come from the mpu "
                 "(Megatron order) or from placer_mesh.")
    return notes
