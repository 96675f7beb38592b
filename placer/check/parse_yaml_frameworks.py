"""Read GPT-NeoX YAML and NeMo / Megatron-Bridge (Hydra) YAML recipes into a ParsedConfig.

GPT-NeoX (EleutherAI/gpt-neox megatron/neox_arguments/neox_args.py): ``pipe_parallel_size``,
``model_parallel_size`` (TP), ``num_layers``/``hidden_size``/``num_attention_heads``,
``seq_length``, DeepSpeed's ``train_micro_batch_size_per_gpu`` and ``zero_optimization``; keys
may be spelt with dashes or underscores. Its pipeline is DeepSpeed's PipelineModule with
``pipe_partition_method`` (default ``type:transformer|mlp``); the world size comes from the
hostfile at launch, so it is not in the file.

NeMo (NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/*): ``trainer.num_nodes``
x ``trainer.devices`` is the world size; degrees and model under ``model``. Hydra
interpolations ``${.key}``, ``${training.model.key}`` and ``${multiply:a,b}`` are resolved; any
other resolver leaves the value unknown.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from placer.check.megatron_flags import SHARDING_ZERO
from placer.check.parse_megatron import read_fp8_recipe
from placer.check.parsed import FP4_AS_FP8, ParsedConfig, Settings
from placer.dialects import megatron, megatron_bridge
from placer.errors import PlacerError
from placer.mesh import parse_order
from placer.spec.model import Model
from placer.spec.presets import validated

# Megatron's rank order, which both NeoX (its Megatron topology) and NeMo use (docs/sources.md 6.1)
MEGATRON_ORDER = megatron.ORDERS[0].text
# GPT-NeoX's default pipeline partitioning (neox_args.py: pipe_partition_method)
NEOX_DEFAULT_PARTITION = "type:transformer|mlp"
# GPT-2 BPE vocabulary padded to a multiple of 128, NeoX's default tokenizer.
NEOX_DEFAULT_VOCAB = 50304
_NEOX_KEYS = ("pipe_parallel_size", "model_parallel_size")
_INTERP_RE = re.compile(r"\$\{([^${}]*)\}")


def _norm(data: dict[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def is_neox(data: Any) -> bool:
    return isinstance(data, dict) and any(k in _norm(data) for k in _NEOX_KEYS)


def is_nemo(data: Any) -> bool:
    """NeMo launcher configs (degrees under ``model``) and Megatron-Bridge overrides (a
    ConfigContainer: ``model`` and ``train`` sections, examples/*/conf/*.yaml)."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return False
    return isinstance(data.get("train"), dict) or any(
        k in data["model"] for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size"))


def _key_line(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if re.match(rf"^\s*[\"']?{re.escape(key).replace('_', '[_-]')}[\"']?\s*:", line):
            return number
    return None


def _pos(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else None


# megatron-core 0.16.1 MLATransformerConfig's defaults (its dataclass fields, which a Bridge or
# NeMo model section overrides; q_lora_rank null: no query compression).
_MLA_DEFAULTS: dict[str, int | None] = {"q_lora_rank": 512, "kv_lora_rank": 512,
                                        "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                                        "v_head_dim": 128}


def _mla(values: dict[str, Any]) -> dict[str, Any]:
    """Model fields of a ``multi_latent_attention: true`` section: the query/key head is
    qk_head_dim (no rotary) + qk_pos_emb_head_dim wide (MLATransformerConfig's q_head_dim)."""
    got = {**_MLA_DEFAULTS, **values}
    return {"head_dim": got["qk_head_dim"] + got["qk_pos_emb_head_dim"],
            "mla": {"q_lora_rank": got["q_lora_rank"], "kv_lora_rank": got["kv_lora_rank"],
                    "qk_rope_head_dim": got["qk_pos_emb_head_dim"],
                    "v_head_dim": got["v_head_dim"]}}


def _model(fields: dict[str, Any], name: str, path: Path, parsed: ParsedConfig
           ) -> Model | None:
    missing = [k for k in ("num_layers", "hidden_size", "num_attention_heads")
               if _pos(fields.get(k)) is None]
    if missing:
        parsed.model_problem = f"model keys missing or not integers: {', '.join(missing)}"
        return None
    values = {k: v for k, v in fields.items() if v is not None}
    return validated(Model, {"name": name, **values}, f"{path} (model keys)")


def parse_neox(path: Path, data: dict[str, Any], text: str) -> ParsedConfig:
    d = _norm(data)
    parsed = ParsedConfig(path=str(path), kind="gpt-neox", order=parse_order(MEGATRON_ORDER))
    s = Settings(tp=_pos(d.get("model_parallel_size")) or 1,
                 pp=_pos(d.get("pipe_parallel_size")) or 1)
    zero = d.get("zero_optimization") or {}
    s.zero_stage = int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    s.micro_batch_size = _pos(d.get("train_micro_batch_size_per_gpu"))
    s.sequence_parallel = bool(d.get("sequence_parallel")) and s.tp > 1
    if d.get("checkpoint_activations"):
        s.recompute = "full"
    if s.pp > 1:  # pipe_parallel_size 0 or 1: no PipelineModule partitioning
        s.partition_method = str(d.get("pipe_partition_method", NEOX_DEFAULT_PARTITION))
    if d.get("precision") == "fp8" or (d.get("te_fp8") or {}):
        s.precision = "fp8"
    parsed.settings = s
    for key, name in (("model_parallel_size", "tp"), ("pipe_parallel_size", "pp"),
                      ("num_layers", "num_layers"), ("seq_length", "seq_len")):
        line = _key_line(text, key)
        if line is not None:
            parsed.lines[name] = line
    parsed.seq_len = _pos(d.get("seq_length"))
    parsed.global_batch_size = _pos(d.get("train_batch_size"))
    hidden = _pos(d.get("hidden_size"))
    parsed.model = _model({
        "num_layers": d.get("num_layers"), "hidden_size": hidden,
        "num_attention_heads": d.get("num_attention_heads"),
        "num_kv_heads": _pos(d.get("num_kv_heads")),
        "ffn_hidden_size": _pos(d.get("intermediate_size")) or (4 * hidden if hidden else None),
        "vocab_size": NEOX_DEFAULT_VOCAB,
        "tied_embeddings": not bool(d.get("no_weight_tying", False)),
    }, re.sub(r"[^A-Za-z0-9._+-]", "-", path.stem) or "neox-model", path, parsed)
    parsed.notes.append("GPT-NeoX takes its world size from the hostfile at launch")
    return parsed


def _resolve(value: Any, root: dict[str, Any], here: dict[str, Any], depth: int = 0) -> Any:
    """A Hydra/OmegaConf value with ``${...}`` interpolations resolved, or None if unknown."""
    if not isinstance(value, str) or "${" not in value or depth > 8:
        return value if depth <= 8 else None
    whole = _INTERP_RE.fullmatch(value.strip())
    while True:
        match = _INTERP_RE.search(value)
        if match is None:
            break
        inner = match.group(1).strip()
        result = _interpolate(inner, root, here, depth)
        if result is None:
            return None
        if whole and match.span() == (0, len(value.strip())):
            return result
        value = value[:match.start()] + str(result) + value[match.end():]
        whole = _INTERP_RE.fullmatch(value.strip())
    try:
        return int(value)
    except ValueError:
        return value


def _interpolate(inner: str, root: dict[str, Any], here: dict[str, Any], depth: int) -> Any:
    if inner.startswith("multiply:"):
        parts = [_resolve(p.strip(), root, here, depth + 1) for p in inner[9:].split(",")]
        if all(isinstance(p, int) for p in parts):
            product = 1
            for part in parts:
                product *= part
            return product
        return None
    if ":" in inner:
        return None  # another resolver: not evaluated
    if inner.startswith("."):
        node: Any = here
        keys = inner[1:].split(".")
    else:
        node = root
        keys = inner.split(".")
        if keys and keys[0] == "training" and "training" not in root:
            keys = keys[1:]  # the launcher mounts this file as `training`
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return _resolve(node, root, here, depth + 1)


def _read_precision(s: Settings, parsed: ParsedConfig, data: dict[str, Any],
                    model: dict[str, Any], text: str) -> None:
    """FP8 from NeMo's ``model.fp8: true``, megatron-core's ``model.fp8`` format string
    (e4m3 / hybrid) with ``model.fp8_recipe``, or Megatron-Bridge's ``mixed_precision``: a
    recipe name (dialects.megatron_bridge.MIXED_PRECISION_RECIPES) or a MixedPrecisionConfig
    mapping (fp8, fp8_recipe, fp4, fp8_param_gather). Bridge's mixed_precision is applied to
    the model last (MixedPrecisionConfig.setup), so it wins over the model's fields."""
    fields: dict[str, Any] = {k: model.get(k) for k in ("fp8", "fp8_recipe", "fp4")}
    fields["fp8_param_gather"] = model.get("fp8_param")
    mixed = data.get("mixed_precision")
    line = _key_line(text, "fp8")
    if isinstance(mixed, str):
        line = _key_line(text, "mixed_precision")
        name = mixed.replace("-", "_")
        if name not in megatron_bridge.MIXED_PRECISION_RECIPES:
            parsed.notes.append(f"mixed_precision {mixed!r}: not a Megatron-Bridge 0.3 recipe "
                                "placer knows; precision read from the model's fields")
        else:
            recipe = megatron_bridge.MIXED_PRECISION_RECIPES[name]
            fields = {"fp8": recipe not in (None, "nvfp4") or None, "fp8_recipe": recipe,
                      "fp4": recipe == "nvfp4" or None,
                      # every Bridge FP8 recipe sets fp8_param_gather = True
                      "fp8_param_gather": recipe not in (None, "nvfp4")}
    elif isinstance(mixed, dict):
        line = _key_line(text, "mixed_precision")
        fields.update({k: mixed[k] for k in ("fp8", "fp8_recipe", "fp4", "fp8_param_gather")
                       if k in mixed})
    if line is not None:
        parsed.lines["fp8_recipe"] = line
    if fields["fp4"]:
        s.precision = "fp8"
        parsed.notes.append(f"FP4 (NVFP4) recipe: {FP4_AS_FP8}")
        return
    if fields["fp8"] not in (True, "e4m3", "hybrid"):
        return
    s.precision = "fp8"
    s.fp8_param_gather = bool(fields["fp8_param_gather"])
    read_fp8_recipe(s, parsed, fields["fp8_recipe"], "fp8_recipe")


def parse_nemo(path: Path, data: dict[str, Any], text: str) -> ParsedConfig:
    model = data["model"]
    trainer = data.get("trainer") or {}
    if not isinstance(trainer, dict):
        raise PlacerError(f"{path}: trainer must be a mapping")
    parsed = ParsedConfig(path=str(path), kind="nemo", order=parse_order(MEGATRON_ORDER))
    # Megatron-Bridge keeps batch sizes under `train` and the sequence under `dataset` too
    train = data.get("train") if isinstance(data.get("train"), dict) else {}
    dataset = data.get("dataset") if isinstance(data.get("dataset"), dict) else {}
    bridge = bool(train)
    parsed.recognised = any(k in model for k in (
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
        "expert_model_parallel_size"))

    def get(table: dict[str, Any], key: str) -> Any:
        return _resolve(table.get(key), data, table)

    s = Settings()
    for key, name in (("tensor_model_parallel_size", "tp"), ("pipeline_model_parallel_size",
                                                            "pp"),
                      ("context_parallel_size", "cp"), ("expert_model_parallel_size", "ep")):
        raw = model.get(key)
        value = get(model, key)
        line = _key_line(text, key)
        if line is not None:
            parsed.lines[name] = line
        if raw is not None and _pos(value) is None:
            parsed.unresolved[name] = f"model.{key} = {raw!r} is not resolved to an integer"
        elif value is not None:
            setattr(s, name, value)
    s.vpp = _pos(get(model, "virtual_pipeline_model_parallel_size"))
    s.micro_batch_size = _pos(get(model, "micro_batch_size")) or _pos(get(train,
                                                                          "micro_batch_size"))
    s.sequence_parallel = bool(get(model, "sequence_parallel")) and s.tp > 1
    granularity = get(model, "activations_checkpoint_granularity")
    if granularity in ("full", "selective"):
        s.recompute = granularity
    optim = model.get("optim") or {}
    if isinstance(optim, dict) and "distributed" in str(optim.get("name", "")):
        s.zero_stage = 1
    # Megatron-Bridge: DistributedDataParallelConfig / OptimizerConfig, as Megatron's flags
    ddp = data.get("ddp") if isinstance(data.get("ddp"), dict) else {}
    optimizer = data.get("optimizer") if isinstance(data.get("optimizer"), dict) else {}
    if ddp.get("use_distributed_optimizer") or optimizer.get("use_distributed_optimizer"):
        s.zero_stage = 1
    if ddp.get("use_megatron_fsdp"):
        s.zero_stage = SHARDING_ZERO.get(str(ddp.get("data_parallel_sharding_strategy")), 3)
    dist = data.get("dist") if isinstance(data.get("dist"), dict) else {}
    if dist.get("use_tp_pp_dp_mapping"):
        parsed.order = parse_order(megatron.ORDERS[1].text)
    _read_precision(s, parsed, data, model, text)
    if s.ep > 1 or _pos(get(model, "num_moe_experts")):
        # Megatron's expert_tensor_parallel_size, which defaults to the dense TP when unset
        s.etp = _pos(get(model, "expert_tensor_parallel_size")) or s.tp
    parsed.settings = s
    parsed.seq_len = (_pos(get(model, "encoder_seq_length")) or _pos(get(model, "seq_length"))
                      or _pos(get(dataset, "seq_length"))
                      or _pos(get(dataset, "sequence_length")))
    parsed.global_batch_size = (_pos(get(model, "global_batch_size"))
                                or _pos(get(train, "global_batch_size")))
    nodes, devices = _pos(get(trainer, "num_nodes")), _pos(get(trainer, "devices"))
    if nodes and devices:
        parsed.world_size, parsed.nproc_per_node = nodes * devices, devices
        parsed.world_source = f"trainer.num_nodes {nodes} x trainer.devices {devices}"
        parsed.lines["world"] = _key_line(text, "num_nodes") or 1
    elif bridge:
        parsed.unresolved["world"] = "a Megatron-Bridge run takes its world size from torchrun"
    else:
        parsed.unresolved["world"] = "trainer.num_nodes x trainer.devices not both integers"
    hidden = _pos(get(model, "hidden_size"))
    experts = _pos(get(model, "num_moe_experts"))
    fields: dict[str, Any] = {
        "num_layers": get(model, "num_layers"), "hidden_size": hidden,
        "num_attention_heads": get(model, "num_attention_heads"),
        "num_kv_heads": _pos(get(model, "num_query_groups")),
        "ffn_hidden_size": _pos(get(model, "ffn_hidden_size")) or (4 * hidden if hidden else None),
        "gated_mlp": get(model, "activation") in ("swiglu", "fast-swiglu", "geglu"),
        "vocab_size": _pos(get(model, "padded_vocab_size")) or NEOX_DEFAULT_VOCAB,
        "tied_embeddings": bool(get(model, "share_embeddings_and_output_weights")
                                if model.get("share_embeddings_and_output_weights") is not None
                                else True),
        # Megatron-Bridge's TransformerConfig field add_bias_linear, NeMo 1's model.bias (both
        # default on, as megatron-core's add_bias_linear)
        "linear_bias": next((v for v in (get(model, "add_bias_linear"), get(model, "bias"))
                             if isinstance(v, bool)), True),
    }
    if get(model, "multi_latent_attention") is True:
        fields.update(_mla({k: get(model, k) for k in model if k in _MLA_DEFAULTS}))
    if experts and experts > 1:
        fields["moe"] = {"num_experts": experts,
                         "top_k": _pos(get(model, "moe_router_topk")) or 2,
                         "expert_ffn_hidden_size": fields["ffn_hidden_size"]}
    run = data.get("run") or {}
    name = str(run.get("name", path.stem)) if isinstance(run, dict) else path.stem
    parsed.model = _model(fields, re.sub(r"[^A-Za-z0-9._+-]", "-", name) or "nemo-model", path,
                          parsed)
    if bridge and parsed.model is None:
        parsed.model_problem = ("a Megatron-Bridge override: the model is its recipe's (Python "
                                "or a Hugging Face id), not in this file")
    if parsed.model is not None and not _pos(get(model, "padded_vocab_size")):
        parsed.notes.append(f"vocabulary from the tokenizer: assumed {NEOX_DEFAULT_VOCAB}")
    return parsed
