"""The command-line flags ``placer check`` reads from Megatron-LM and Megatron-DeepSpeed scripts.

One table per value kind, flag name (dashes, no leading ``--``) -> setting key. Sources:
NVIDIA/Megatron-LM megatron/training/arguments.py (current names) and
bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py (the older names BLOOM's scripts
use: ``--checkpoint-activations``, ``--pad-vocab-size-to``, ``--pp-partition-method``), and the
launchers' own flags (torchrun, ``python -m torch.distributed.launch``, ``deepspeed``).
The names placer also writes come from ``placer.dialects`` (one place for both directions);
this module adds only what check reads and launch never writes.
"""

from __future__ import annotations

from placer.dialects import megatron, megatron_deepspeed

# What check reads beyond what placer writes: the older and Megatron-DeepSpeed names, precision
# and memory flags, and the launchers' own flags.
_READ_ONLY_INT_FLAGS = {
    # Megatron-DeepSpeed MoE (microsoft/Megatron-DeepSpeed megatron/arguments.py)
    "moe-expert-parallel-size": "ep",
    "topk": "moe_topk",
    "pad-vocab-size-to": "padded_vocab_size",
    "recompute-num-layers": "recompute_layers",
    "checkpoint-num-layers": "checkpoint_num_layers",
    "cpu-offloading-num-layers": "offload_layers",
    megatron_deepspeed.ZERO_STAGE_FLAG: "zero_stage",
    # torchrun / torch.distributed.launch
    "nnodes": "nnodes",
    "nproc-per-node": "nproc_per_node",
}
_READ_ONLY_CHOICE_FLAGS = {
    "recompute-method": "recompute_method",
    "fp8-format": "fp8_format",
    "fp8-recipe": "fp8_recipe",
    "fp4-format": "fp4_format",
    "pp-partition-method": "partition_method",
    megatron.LAYOUT_FLAG: "pp_layout",
    megatron_deepspeed.CONFIG_FLAG: "deepspeed_config",
    "recompute-modules": "recompute_modules",
    "cross-entropy-fusion-impl": "cross_entropy_impl",
}
# flags taking several values (argparse nargs="+")
LIST_FLAGS = ("recompute-modules",)
_READ_ONLY_BOOL_FLAGS = {
    "checkpoint-activations": "checkpoint_activations",
    "standalone": "standalone",
    "fp8-param-gather": "fp8_param_gather",
    "grad-reduce-in-bf16": "grad_reduce_bf16",
    "cross-entropy-loss-fusion": "cross_entropy_fusion",
    "fp8-hybrid": "fp8",
    "fp8-e4m3": "fp8",
    megatron_deepspeed.ENABLE_FLAG: "deepspeed",
    "bf16": "bf16",
    "fp16": "fp16",
    "no-pipeline-parallel": "no_pipeline_parallel",
    "optimizer-cpu-offload": "optimizer_offload",
    "cpu-optimizer": "optimizer_offload",
    "account-for-embedding-in-pipeline-split": "embedding_in_split",
    "account-for-loss-in-pipeline-split": "loss_in_split",
    # add_bias_linear off (megatron-core transformer_config.py; Model.linear_bias)
    "disable-bias-linear": "disable_bias_linear",
}
INT_FLAGS = {**megatron.INT_FLAGS, **megatron_deepspeed.LAUNCHER_INT_FLAGS,
             **_READ_ONLY_INT_FLAGS}
CHOICE_FLAGS = {**megatron.CHOICE_FLAGS, **_READ_ONLY_CHOICE_FLAGS}
BOOL_FLAGS = {**megatron.BOOL_FLAGS, **_READ_ONLY_BOOL_FLAGS}
# keys whose value decides the layout or the world size: unresolved, they are reported and the
# checks that need them skipped (nothing is guessed)
PARALLEL_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "layers_per_virtual_stage",
                 "first_stage_layers", "last_stage_layers", "micro_batch_size", "nnodes",
                 "nproc_per_node")
MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads")
# keys a launcher or precision flag sets: on their own they are no parallel settings
LAUNCH_ONLY_KEYS = ("nnodes", "nproc_per_node", "standalone", "bf16", "fp16", "deepspeed_config",
                    "world")
SHARDING_ZERO = megatron.SHARDING_ZERO
# Commands whose arguments are text, not a launch (echo "--tp 8" launches nothing).
PRINTING_COMMANDS = ("echo", "printf", "cat", "tee", "logger")


def all_flags() -> set[str]:
    return set(INT_FLAGS) | set(CHOICE_FLAGS) | set(BOOL_FLAGS)
