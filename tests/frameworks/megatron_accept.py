"""Build megatron-core's own configs from placer's megatron_args.sh; generate its process groups.

``python megatron_accept.py MANIFEST.json``; each case ``{"id", "dir", "model": {...},
"world_size"}`` with the plan's model dimensions (megatron_args.sh carries only the parallel,
batch and precision flags; the model and data flags are the user's). The megatron-core wheel
has no ``megatron/training/arguments.py``, so the flags are read by the parser below, whose
names and dests are those of arguments.py (NVIDIA/Megatron-LM core_v0.16.1); an unknown flag is
an error. They then go into ``TransformerConfig`` and ``DistributedDataParallelConfig`` the way
arguments.py's ``core_transformer_config_from_args`` (L1306-1331) passes them, so megatron-core's
own ``__post_init__`` checks run on them. ``RankGenerator`` (parallel_state.py, the generator
``initialize_model_parallel`` uses, L775-806) then gives every process group for the order the
flags select, for comparison with rankmap.json. One stub, forced by a CPU-only machine: the
Transformer Engine version MoE FP8 configs ask for (``_stub_te_version``).

megatron_bridge_overrides.yaml (Megatron-Bridge 0.3.1 ConfigContainer sections): its ``model``
section goes into megatron-core's ``TransformerConfig`` (Bridge's ``GPTModelProvider`` is one)
and its ``ddp`` section into ``DistributedDataParallelConfig``, so megatron-core checks them.
Here every field name is checked against the dataclass fields Bridge's source declares
(``$PLACER_MEGATRON_BRIDGE_SRC``, the unpacked wheel, read with ``ast``) and megatron-core's
classes they extend, and the named mixed-precision recipe is applied as Bridge's
mixed_precision.py writes it: bf16, params_dtype and pipeline_dtype bfloat16 for the bf16_*
recipes (L172-182), and the fp8 and fp8_recipe its function sets, read from Bridge's source
(``recipe_settings``). Bridge's
own YAML merge and setup, loaded from its source files (its package ``__init__`` imports
transformers and its LoRA module transformer_engine), run in bridge_apply.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

# flag -> (dest, type); type None = store_true. Dests as in arguments.py.
FLAGS: dict[str, tuple[str, Any]] = {
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", int),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", int),
    "--num-virtual-stages-per-pipeline-rank": ("num_virtual_stages_per_pipeline_rank", int),
    "--decoder-first-pipeline-num-layers": ("decoder_first_pipeline_num_layers", int),
    "--decoder-last-pipeline-num-layers": ("decoder_last_pipeline_num_layers", int),
    "--pipeline-model-parallel-layout": ("pipeline_model_parallel_layout", str),
    "--context-parallel-size": ("context_parallel_size", int),
    "--num-experts": ("num_experts", int),
    "--expert-model-parallel-size": ("expert_model_parallel_size", int),
    "--expert-tensor-parallel-size": ("expert_tensor_parallel_size", int),
    "--sequence-parallel": ("sequence_parallel", None),
    "--micro-batch-size": ("micro_batch_size", int),
    "--global-batch-size": ("global_batch_size", int),
    "--seq-length": ("seq_length", int),
    "--recompute-granularity": ("recompute_granularity", str),
    "--recompute-method": ("recompute_method", str),
    "--recompute-num-layers": ("recompute_num_layers", int),
    "--use-megatron-fsdp": ("use_megatron_fsdp", None),
    "--data-parallel-sharding-strategy": ("data_parallel_sharding_strategy", str),
    "--ckpt-format": ("ckpt_format", str),
    "--no-gradient-accumulation-fusion": ("no_gradient_accumulation_fusion", None),
    "--use-distributed-optimizer": ("use_distributed_optimizer", None),
    "--bf16": ("bf16", None),
    "--fp8-format": ("fp8", str),
    "--fp8-recipe": ("fp8_recipe", str),
    "--use-tp-pp-dp-mapping": ("use_tp_pp_dp_mapping", None),
    # runtime settings: arguments.py L2243, L2264, L2178, L1398; TransformerConfig fields made
    # flags (L1621): tp_comm_overlap, overlap_moe_expert_parallel_comm, moe_token_dispatcher_type
    "--overlap-grad-reduce": ("overlap_grad_reduce", None),
    "--overlap-param-gather": ("overlap_param_gather", None),
    "--grad-reduce-in-bf16": ("grad_reduce_in_bf16", None),
    "--fp8-param-gather": ("fp8_param_gather", None),
    "--tp-comm-overlap": ("tp_comm_overlap", None),
    "--overlap-moe-expert-parallel-comm": ("overlap_moe_expert_parallel_comm", None),
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", str),
    # multi-head latent attention: the switch and --qk-layernorm are TransformerConfig fields
    # made flags (arguments.py L1621), the shapes _add_mla_args (L2723-2734)
    "--multi-latent-attention": ("multi_latent_attention", None),
    "--qk-layernorm": ("qk_layernorm", None),
    "--q-lora-rank": ("q_lora_rank", int),
    "--kv-lora-rank": ("kv_lora_rank", int),
    "--qk-head-dim": ("qk_head_dim", int),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", int),
    "--v-head-dim": ("v_head_dim", int),
}
# arguments.py's defaults where they are not None (_add_mla_args L2727-2733)
DEFAULTS = {"kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
MLA_FIELDS = ("multi_latent_attention", "qk_layernorm", "q_lora_rank", "kv_lora_rank",
              "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")


def _argv(folder: str) -> list[str]:
    done = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\0" "${MEGATRON_ARGS[@]}"',
                           "bash", str(Path(folder, "megatron_args.sh"))],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.split("\0")[:-1]


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    for flag, (dest, kind) in FLAGS.items():
        if kind is None:
            parser.add_argument(flag, dest=dest, action="store_true")
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=DEFAULTS.get(dest))
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(f"flags Megatron-LM core_v0.16.1 does not define: {unknown}")
    return args


def _transformer_config(args: argparse.Namespace, model: dict[str, Any]) -> Any:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    kw: dict[str, Any] = {
        # the model (the user's flags, from the plan)
        "num_layers": model["num_layers"], "hidden_size": model["hidden_size"],
        "num_attention_heads": model["num_attention_heads"],
        "ffn_hidden_size": model["ffn_hidden_size"], "kv_channels": model["head_dim"],
        "num_query_groups": model["num_kv_heads"],
        "add_bias_linear": model["add_bias_linear"],
        # placer's flags, renamed as core_transformer_config_from_args does
        "tensor_model_parallel_size": args.tensor_model_parallel_size,
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
        "context_parallel_size": args.context_parallel_size,
        "sequence_parallel": args.sequence_parallel,
        "num_layers_in_first_pipeline_stage": args.decoder_first_pipeline_num_layers,
        "num_layers_in_last_pipeline_stage": args.decoder_last_pipeline_num_layers,
        "pipeline_model_parallel_layout": args.pipeline_model_parallel_layout,
        "bf16": args.bf16, "params_dtype": torch.bfloat16, "pipeline_dtype": torch.bfloat16,
        "deallocate_pipeline_outputs": True,
        "gradient_accumulation_fusion": not args.no_gradient_accumulation_fusion,
    }
    if args.num_virtual_stages_per_pipeline_rank:  # arguments.py L552: vpp is this flag
        kw["virtual_pipeline_model_parallel_size"] = args.num_virtual_stages_per_pipeline_rank
    if args.recompute_granularity:
        kw.update(recompute_granularity=args.recompute_granularity,
                  recompute_method=args.recompute_method,
                  recompute_num_layers=args.recompute_num_layers)
    if args.fp8:
        kw["fp8"] = args.fp8
    if args.fp8_recipe:
        kw["fp8_recipe"] = args.fp8_recipe
    kw.update(tp_comm_overlap=args.tp_comm_overlap,
              overlap_moe_expert_parallel_comm=args.overlap_moe_expert_parallel_comm)
    if args.moe_token_dispatcher_type:
        kw["moe_token_dispatcher_type"] = args.moe_token_dispatcher_type
    if model["gated_mlp"]:
        kw.update(activation_func=F.silu, gated_linear_unit=True)
    if args.num_experts:
        kw.update(num_moe_experts=args.num_experts,
                  expert_model_parallel_size=args.expert_model_parallel_size,
                  expert_tensor_parallel_size=args.expert_tensor_parallel_size,
                  moe_ffn_hidden_size=model["expert_ffn_hidden_size"],
                  moe_router_topk=model["top_k"])
    if args.multi_latent_attention:
        # core_transformer_config_from_args L1311: MLATransformerConfig; --rope-type unset keeps
        # its yarn (L1353-1355); --no-rope-fusion unset leaves apply_rope_fusion on.
        kw.update({k: getattr(args, k) for k in MLA_FIELDS}, apply_rope_fusion=True)
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def _groups(args: argparse.Namespace, world: int) -> dict[str, list[list[int]]]:
    from megatron.core.parallel_state import RankGenerator

    tp, pp, cp = (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                  args.context_parallel_size)
    dp = world // (tp * pp * cp)
    # initialize.py L378: tp-cp-ep-dp-pp, or tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping.
    order = "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
    ep = args.expert_model_parallel_size or 1
    etp = args.expert_tensor_parallel_size or tp
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1, order=order)
    out = {name: dense.get_ranks(token) for name, token in
           (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("dp_cp", "dp-cp"))}
    out.update({name: expert.get_ranks(token) for name, token in
                (("ep", "ep"), ("etp", "tp"), ("edp", "dp"))})
    return {k: sorted(sorted(g) for g in v) for k, v in out.items()}


# ConfigContainer section -> (Bridge source file, Bridge class, megatron-core base to import).
BRIDGE_SECTIONS = {
    "model": ("models/gpt_provider.py", "GPTModelProvider",
              "megatron.core.transformer:TransformerConfig"),
    "train": ("training/config.py", "TrainingConfig", None),
    "dataset": ("training/config.py", "GPTDatasetConfig",
                "megatron.core.datasets.gpt_dataset:GPTDatasetConfig"),
    "ddp": ("training/config.py", "DistributedDataParallelConfig",
            "megatron.core.distributed:DistributedDataParallelConfig"),
    "optimizer": ("training/config.py", "OptimizerConfig",
                  "megatron.core.optimizer:OptimizerConfig"),
    "dist": ("training/config.py", "DistributedInitConfig", None),
    "checkpoint": ("training/config.py", "CheckpointConfig", None),
    "comm_overlap": ("training/comm_overlap.py", "CommOverlapConfig", None),
}


def _bridge_fields(src: Path, section: str, mla: bool = False) -> set[str]:
    """The section class's fields; with ``mla`` the model section is Bridge's MLAModelProvider
    (models/mla_provider.py: MLATransformerConfig + GPTModelProvider, no fields of its own)."""
    import ast
    import dataclasses
    import importlib

    file, cls, base = BRIDGE_SECTIONS[section]
    mla_base = "megatron.core.transformer:MLATransformerConfig" if mla else None
    tree = ast.parse((src / "megatron" / "bridge" / file).read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names |= {n.target.id for n in node.body
                      if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for base_path in (base, mla_base):
        if base_path:
            module, _, name = base_path.partition(":")
            names |= {f.name for f in dataclasses.fields(getattr(importlib.import_module(module),
                                                                 name))}
    return names


def recipe_settings(src: Path, name: str) -> dict[str, Any]:
    """What Bridge's named mixed-precision recipe sets (``cfg.<field> = <literal>`` in its
    function in training/mixed_precision.py, after the settings of the recipe it starts from,
    ``cfg = bf16_mixed()``), read from Bridge's source with ``ast``."""
    import ast

    tree = ast.parse((src / "megatron/bridge/training/mixed_precision.py").read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    out: dict[str, Any] = {}
    for node in ast.walk(functions[name]) if name in functions else ():
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if (isinstance(target, ast.Name) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id in functions):
            out = {**recipe_settings(src, node.value.func.id), **out}
        elif isinstance(target, ast.Attribute) and isinstance(node.value, ast.Constant):
            out[target.attr] = node.value.value
    return out


def check_bridge(case: dict[str, Any], src: Path | None) -> dict[str, Any]:
    import yaml
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    doc = yaml.safe_load(Path(case["dir"], "megatron_bridge_overrides.yaml").read_text())
    out: dict[str, Any] = {"doc": doc}
    mla = bool(doc["model"].get("multi_latent_attention"))
    if src is not None:
        # _target_ names the class Bridge instantiates (bridge_apply.py runs it), not a field.
        out["unknown"] = {sec: sorted(set(keys) - {"_target_"} - _bridge_fields(src, sec, mla))
                          for sec, keys in doc.items() if isinstance(keys, dict)}
        recipes = (src / "megatron/bridge/training/mixed_precision.py").read_text()
        if f"def {doc.get('mixed_precision')}()" not in recipes:
            out["unknown"]["mixed_precision"] = [doc.get("mixed_precision")]
        out["unknown"] = {k: v for k, v in out["unknown"].items() if v}
    model = case["model"]
    import torch

    kw = {k: v for k, v in doc["model"].items() if k != "seq_length"}
    recipe = str(doc.get("mixed_precision"))
    if recipe.startswith("bf16"):
        kw.update(bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    if src is not None:
        settings = recipe_settings(src, recipe)
        out["mixed_precision_settings"] = settings
        kw.update({k: v for k, v in settings.items() if k in ("fp8", "fp8_recipe")})
    kw.update(num_layers=model["num_layers"], hidden_size=model["hidden_size"],
              num_attention_heads=model["num_attention_heads"],
              ffn_hidden_size=model["ffn_hidden_size"], kv_channels=model["head_dim"],
              num_query_groups=model["num_kv_heads"], add_bias_linear=model["add_bias_linear"])
    if "expert_model_parallel_size" in kw:
        kw.update(num_moe_experts=model["num_experts"],
                  moe_ffn_hidden_size=model["expert_ffn_hidden_size"],
                  moe_router_topk=model["top_k"])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            config = (MLATransformerConfig if mla else TransformerConfig)(**kw)
            DistributedDataParallelConfig(**doc["ddp"])
        except (AssertionError, ValueError, TypeError) as exc:
            out["error"] = f"megatron-core: {type(exc).__name__}: {exc}"
            return out
    out["vpp"] = config.virtual_pipeline_model_parallel_size
    out["mla"] = {k: getattr(config, k, None) for k in MLA_FIELDS}
    return out


def check(case: dict[str, Any]) -> dict[str, Any]:
    from megatron.core.distributed import DistributedDataParallelConfig

    out: dict[str, Any] = {"id": case["id"]}
    argv = _argv(case["dir"])
    out["argv"] = argv
    try:
        args = _parse(argv)
    except (ValueError, argparse.ArgumentError) as exc:
        out["error"] = f"arguments: {exc}"
        return out
    # validate_args's rules for these flags (core_v0.16.1 arguments.py L597-601, L655-657,
    # L915-916), as written there
    sharded = args.use_distributed_optimizer or args.use_megatron_fsdp
    for broken, why in ((args.overlap_param_gather and not (sharded and args.overlap_grad_reduce),
                         "--overlap-param-gather needs the distributed optimizer or Megatron-FSDP"
                         " and --overlap-grad-reduce"),
                        (args.fp8_param_gather and not sharded,
                         "--fp8-param-gather needs the distributed optimizer or an FSDP"),
                        (args.tp_comm_overlap and not args.sequence_parallel,
                         "--tp-comm-overlap needs --sequence-parallel")):
        if broken:
            out["error"] = f"arguments: {why}"
            return out
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            config = _transformer_config(args, case["model"])
            ddp = DistributedDataParallelConfig(
                use_distributed_optimizer=args.use_distributed_optimizer,
                use_megatron_fsdp=args.use_megatron_fsdp,
                data_parallel_sharding_strategy=args.data_parallel_sharding_strategy or
                "no_shard", overlap_grad_reduce=args.overlap_grad_reduce,
                overlap_param_gather=args.overlap_param_gather,
                grad_reduce_in_fp32=not args.grad_reduce_in_bf16)
        except (AssertionError, ValueError, TypeError) as exc:
            out["error"] = f"megatron-core: {type(exc).__name__}: {exc}"
            return out
    out["config"] = {k: getattr(config, k) for k in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "virtual_pipeline_model_parallel_size", "sequence_parallel", "expert_model_parallel_size",
        "expert_tensor_parallel_size", "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage", "recompute_granularity", "tp_comm_overlap",
        "overlap_moe_expert_parallel_comm", "moe_token_dispatcher_type", "fp8", "fp8_recipe")}
    out["mla"] = {k: getattr(config, k, None) for k in MLA_FIELDS}
    out["config_class"] = type(config).__name__
    out["ddp"] = {"use_distributed_optimizer": ddp.use_distributed_optimizer,
                  "use_megatron_fsdp": ddp.use_megatron_fsdp,
                  "data_parallel_sharding_strategy": ddp.data_parallel_sharding_strategy,
                  "overlap_grad_reduce": ddp.overlap_grad_reduce,
                  "overlap_param_gather": ddp.overlap_param_gather,
                  "grad_reduce_in_fp32": ddp.grad_reduce_in_fp32}
    out["args"] = {k: getattr(args, k) for k in ("micro_batch_size", "global_batch_size",
                                                  "seq_length", "ckpt_format")}
    out["groups"] = _groups(args, case["world_size"])
    if Path(case["dir"], "megatron_bridge_overrides.yaml").exists():
        env = os.environ.get("PLACER_MEGATRON_BRIDGE_SRC")
        out["bridge"] = check_bridge(case, Path(env) if env else None)
    return out


def _stub_te_version() -> None:
    """Stub (CPU only): Transformer Engine is a CUDA build and cannot be installed here, but
    TransformerConfig asks its version for MoE with FP8 (transformer_config.py: TE >= 1.7 for
    MoE FP8, >= 1.11 for FP8 grouped GEMM). Its version is taken as the lowest the megatron-core
    wheel itself pins (its ``dev`` extra: transformer-engine>=2.9.0a0,<2.12.0), read from the
    wheel's metadata; with TE installed, nothing is stubbed."""
    import importlib.metadata as metadata
    import importlib.util
    import re

    from megatron.core import utils
    from packaging.version import Version

    if importlib.util.find_spec("transformer_engine") is not None:
        return
    pins = [r for r in metadata.requires("megatron-core") or []
            if r.startswith("transformer-engine")]
    found = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", pins[0]) if pins else None
    if found is None:
        raise RuntimeError(f"megatron-core declares no transformer-engine lower bound: {pins}")
    utils._te_version = Version(found.group(1))


def main() -> None:
    _stub_te_version()
    for case in json.loads(Path(sys.argv[1]).read_text()):
        try:
            result = check(case)
        except Exception:
            result = {"id": case["id"], "error": traceback.format_exc()}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
