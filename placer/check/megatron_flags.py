"""The command-line flags ``placer check`` reads from Megatron-LM and Megatron-DeepSpeed scripts.

One table per value kind, flag name (dashes, no leading ``--``) -> setting key. Sources:
NVIDIA/Megatron-LM megatron/training/arguments.py (current names) and
bigscience-workshop/Megatron-DeepSpeed megatron/arguments.py (the older names BLOOM's scripts
use: ``--checkpoint-activations``, ``--pad-vocab-size-to``, ``--pp-partition-method``), and the
launchers' own flags (torchrun, ``python -m torch.distributed.launch``, ``deepspeed``).
These tables move to placer/dialects once that package exists (issue #13).
"""

from __future__ import annotations

INT_FLAGS = {
    "tensor-model-parallel-size": "tp",
    "pipeline-model-parallel-size": "pp",
    "context-parallel-size": "cp",
    "expert-model-parallel-size": "ep",
    # Megatron-DeepSpeed MoE (microsoft/Megatron-DeepSpeed megatron/arguments.py)
    "moe-expert-parallel-size": "ep",
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
    "topk": "moe_topk",
    "moe-ffn-hidden-size": "moe_ffn_hidden_size",
    "moe-shared-expert-intermediate-size": "shared_expert_ffn_hidden_size",
    "padded-vocab-size": "padded_vocab_size",
    "pad-vocab-size-to": "padded_vocab_size",
    "vocab-size": "vocab_size",
    "max-position-embeddings": "max_position_embeddings",
    "recompute-num-layers": "recompute_layers",
    "checkpoint-num-layers": "checkpoint_num_layers",
    "cpu-offloading-num-layers": "offload_layers",
    "zero-stage": "zero_stage",
    # launchers: torchrun / torch.distributed.launch, and deepspeed --num_gpus N --num_nodes M
    "nnodes": "nnodes",
    "nproc-per-node": "nproc_per_node",
    "num-nodes": "nnodes",
    "num-gpus": "nproc_per_node",
}
CHOICE_FLAGS = {
    "recompute-granularity": "recompute",
    "recompute-method": "recompute_method",
    "data-parallel-sharding-strategy": "sharding_strategy",
    "fp8-format": "fp8_format",
    "pp-partition-method": "partition_method",
    "pipeline-model-parallel-layout": "pp_layout",
    "deepspeed-config": "deepspeed_config",
    "deepspeed_config": "deepspeed_config",
}
BOOL_FLAGS = {
    "sequence-parallel": "sequence_parallel",
    "use-tp-pp-dp-mapping": "tp_pp_dp_mapping",
    "swiglu": "swiglu",
    "group-query-attention": "group_query_attention",
    "use-distributed-optimizer": "distributed_optimizer",
    "use-torch-fsdp2": "fsdp",
    "use-megatron-fsdp": "fsdp",
    "untie-embeddings-and-output-weights": "untie",
    "recompute-activations": "recompute_activations",
    "checkpoint-activations": "checkpoint_activations",
    "standalone": "standalone",
    "fp8-param-gather": "fp8_param_gather",
    "grad-reduce-in-bf16": "grad_reduce_bf16",
    "fp8-hybrid": "fp8",
    "fp8-e4m3": "fp8",
    "deepspeed": "deepspeed",
    "bf16": "bf16",
    "no-pipeline-parallel": "no_pipeline_parallel",
    "optimizer-cpu-offload": "optimizer_offload",
    "cpu-optimizer": "optimizer_offload",
    "account-for-embedding-in-pipeline-split": "embedding_in_split",
    "account-for-loss-in-pipeline-split": "loss_in_split",
}
# keys whose value decides the layout: unresolved, they are reported (nothing is guessed)
PARALLEL_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "layers_per_virtual_stage",
                 "first_stage_layers", "last_stage_layers", "sequence_parallel",
                 "tp_pp_dp_mapping", "micro_batch_size", "nnodes", "nproc_per_node")
MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads")
# ZeRO stage each Megatron sharding setting amounts to (conventions.md 6.2).
SHARDING_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
# Commands whose arguments are text, not a launch (echo "--tp 8" launches nothing).
PRINTING_COMMANDS = ("echo", "printf", "cat", "tee", "logger")


def all_flags() -> set[str]:
    return set(INT_FLAGS) | set(CHOICE_FLAGS) | set(BOOL_FLAGS)
