"""Megatron-DeepSpeed scripts: Megatron-LM flags plus DeepSpeed's launcher and ZeRO flags.

Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed) keeps Megatron-LM's parallel flags
(``placer.dialects.megatron``) and adds ``--deepspeed``, ``--deepspeed_config FILE`` and
``--zero-stage N`` (megatron/arguments.py ``_add_deepspeed_args``); its scripts start ranks with
DeepSpeed's launcher, ``deepspeed --num_nodes M --num_gpus N``. Its mpu is Megatron's, so the
rank order is Megatron's default (``megatron.ORDERS[0]``).
"""

from __future__ import annotations

# Launcher flags (normalised to dashes, as readers normalise them) -> setting key.
LAUNCHER_INT_FLAGS = {"num-nodes": "nnodes", "num-gpus": "nproc_per_node"}
# ZeRO stage from the Megatron-DeepSpeed argument; the JSON's zero_optimization.stage wins
# when both are present (DeepSpeed reads the config file).
ZERO_STAGE_FLAG = "zero-stage"
CONFIG_FLAG = "deepspeed-config"
ENABLE_FLAG = "deepspeed"
