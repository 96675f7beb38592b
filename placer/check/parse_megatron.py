"""Read a Megatron-LM launch script (or a plain argument list) into a ParsedConfig.

Flags may be ``--flag value`` or ``--flag=value``, anywhere in the script (arrays, variables,
continuations); the last occurrence wins, as with argparse. The world size comes from the
torchrun flags in the script when present, else from ``WORLD_SIZE`` or ``GPUS_PER_NODE`` x
``NNODES``-style variables. The model comes from the architecture flags when they are all there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from placer.check.parsed import ParsedConfig
from placer.check.shell import Token, tokens
from placer.errors import PlacerError
from placer.mesh import parse_order
from placer.spec.model import Model
from placer.spec.presets import validated
from placer.spec.text import decimal

# Megatron's training entry point passes this order, or the second one with
# --use-tp-pp-dp-mapping (conventions.md 6.1).
MEGATRON_ORDER = "tp-cp-ep-dp-pp"
MEGATRON_TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"
# Used when the script gives no --vocab-size / --padded-vocab-size (the tokenizer decides it in
# Megatron); 32000 is the Llama-2 tokenizer's size (placer's llama2 presets).
DEFAULT_VOCAB_SIZE = 32000
# Megatron's --moe-router-topk default (megatron/training/arguments.py).
DEFAULT_MOE_TOPK = 2

# flag -> setting key, for integer flags
_INT_FLAGS = {
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
    "nnodes": "nnodes",
    "nproc-per-node": "nproc_per_node",
    # the DeepSpeed launcher of Megatron-DeepSpeed scripts: deepspeed --num_gpus N --num_nodes M
    "num-nodes": "nnodes",
    "num-gpus": "nproc_per_node",
}
_CHOICE_FLAGS = {"recompute-granularity": "recompute",
                 "data-parallel-sharding-strategy": "sharding_strategy"}
_BOOL_FLAGS = {
    "sequence-parallel": "sequence_parallel",
    "use-tp-pp-dp-mapping": "tp_pp_dp_mapping",
    "swiglu": "swiglu",
    "group-query-attention": "group_query_attention",
    "use-distributed-optimizer": "distributed_optimizer",
    "use-torch-fsdp2": "fsdp",
    "use-megatron-fsdp": "fsdp",
    "untie-embeddings-and-output-weights": "untie",
    "recompute-activations": "recompute_activations",
    "standalone": "standalone",
}
_PARALLEL_KEYS = ("tp", "pp", "cp", "ep", "etp", "vpp", "layers_per_virtual_stage",
                  "first_stage_layers", "last_stage_layers", "sequence_parallel",
                  "tp_pp_dp_mapping")
# Megatron's explicit per-stage layer layout (conventions.md 6.2, "Uneven PP").
_LAYOUT_FLAG = "pipeline-model-parallel-layout"
_MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads")
# ZeRO stage each Megatron sharding setting amounts to (conventions.md 6.2).
_SHARDING_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
_GPUS_VARS = ("GPUS_PER_NODE", "NPROC_PER_NODE", "NGPUS_PER_NODE", "NUM_GPUS_PER_NODE", "NGPU")
_NODES_VARS = ("NNODES", "NUM_NODES", "N_NODES", "NODES")


@dataclass(frozen=True)
class _Value:
    text: str | None
    raw: str
    line: int


def parse_megatron(path: Path, text: str) -> ParsedConfig:
    """Settings of a Megatron launch script; unresolvable parallel flags are input errors."""
    values, last_token = _flag_values(list(tokens(text)))
    parsed = ParsedConfig(path=str(path), kind="megatron")
    ints = {key: _int(values[flag], flag, path) for flag, key in _INT_FLAGS.items()
            if flag in values and (key in _PARALLEL_KEYS or values[flag].text is not None)}
    ints = {k: v for k, v in ints.items() if v is not None}
    for flag, key in (*_INT_FLAGS.items(), *_CHOICE_FLAGS.items(), *_BOOL_FLAGS.items()):
        if flag in values:
            parsed.lines.setdefault(key, values[flag].line)
    for flag in values:
        if values[flag].text is None and _INT_FLAGS.get(flag) not in _PARALLEL_KEYS:
            parsed.notes.append(f"line {values[flag].line}: --{flag} {values[flag].raw} could "
                                "not be resolved without running the script; ignored")
    flags = {key for flag, key in _BOOL_FLAGS.items() if flag in values}
    choices = {key: values[flag].text for flag, key in _CHOICE_FLAGS.items() if flag in values}

    settings: dict[str, object] = {k: ints[k] for k in ("tp", "pp", "cp", "ep", "vpp",
                                                         "micro_batch_size") if k in ints}
    for key in ("layers_per_virtual_stage", "first_stage_layers", "last_stage_layers"):
        if key in ints:
            settings[key] = ints[key]
    if _LAYOUT_FLAG in values:
        settings["pipeline_layout"] = values[_LAYOUT_FLAG].raw
        parsed.lines.setdefault("pipeline_layout", values[_LAYOUT_FLAG].line)
    if "num_experts" in ints or ints.get("ep", 1) > 1:
        # Megatron's --expert-tensor-parallel-size defaults to the TP size (conventions.md 6.2).
        settings["etp"] = ints.get("etp", ints.get("tp", 1))
    elif "etp" in ints:
        settings["etp"] = ints["etp"]
    # Megatron turns --sequence-parallel off when TP is 1 (conventions.md 6.2).
    settings["sequence_parallel"] = "sequence_parallel" in flags and ints.get("tp", 1) > 1
    if "recompute_activations" in flags:
        settings["recompute"] = "selective"
    if choices.get("recompute") in ("full", "selective"):
        settings["recompute"] = choices["recompute"]
    zero = 3 if "fsdp" in flags else 1 if "distributed_optimizer" in flags else 0
    zero = _SHARDING_ZERO.get(choices.get("sharding_strategy") or "", zero)
    settings["zero_stage"] = zero
    parsed.settings = settings
    if "tp_pp_dp_mapping" in flags:
        parsed.order = parse_order(MEGATRON_TP_PP_DP_ORDER)
    else:
        parsed.order = parse_order(MEGATRON_ORDER)
    parsed.seq_len = ints.get("seq_len")
    parsed.global_batch_size = ints.get("global_batch_size")
    parsed.nproc_per_node, parsed.world_size = _world(ints, flags, last_token, parsed)
    parsed.model = _model(ints, flags, path, parsed)
    parsed.recognised = bool(set(ints) | flags | set(choices))
    return parsed


def _flag_values(words: list[Token]) -> tuple[dict[str, _Value], Token | None]:
    """The last value of every flag of interest (dashes normalised: nproc_per_node too)."""
    known = set(_INT_FLAGS) | set(_CHOICE_FLAGS) | set(_BOOL_FLAGS) | {_LAYOUT_FLAG}
    values: dict[str, _Value] = {}
    for i, word in enumerate(words):
        if not word.text.startswith("--"):
            continue
        name, eq, inline = word.text[2:].partition("=")
        name = name.replace("_", "-")
        if name not in known:
            continue
        if name in _BOOL_FLAGS:
            values[name] = _Value("true", word.text, word.line)
            continue
        if eq:
            raw, value = inline, Token(inline, word.line, word.variables).expand()
        elif i + 1 < len(words) and not words[i + 1].text.startswith("--"):
            raw, value = words[i + 1].text, words[i + 1].expand()
        else:
            raise PlacerError(f"line {word.line}: --{name} has no value")
        values[name] = _Value(value, raw, word.line)
    return values, (words[-1] if words else None)


def _int(value: _Value, flag: str, path: Path) -> int | None:
    if value.text is None:
        raise PlacerError(f"{path}:{value.line}: --{flag} {value.raw}: cannot resolve the value "
                          "without running the script; set the variable in the script")
    text = value.text.strip()
    if flag == "nnodes" and ":" in text:
        text = text.split(":")[-1]
    if flag == "nproc-per-node" and text in ("gpu", "auto", "cuda"):
        return None
    number = decimal(text)
    if number is None or number < 1:
        raise PlacerError(f"{path}:{value.line}: --{flag} {value.raw!r} is not a positive integer")
    return number


def _var_int(token: Token | None, names: tuple[str, ...]) -> int | None:
    """The first of ``names`` set to a positive integer by the end of the script."""
    variables = dict(token.variables) if token else {}
    for name in names:
        value = variables.get(name)
        number = decimal(value.strip()) if value is not None else None
        if number:
            return number
    return None


def _world(ints: dict[str, int], flags: set[str], last: Token | None,
           parsed: ParsedConfig) -> tuple[int | None, int | None]:
    """(processes per node, world size) from torchrun flags, else script variables."""
    nproc = ints.get("nproc_per_node")
    nnodes = 1 if "standalone" in flags else ints.get("nnodes")
    if nproc is None:
        nproc = _var_int(last, _GPUS_VARS)
    if nnodes is None:
        nnodes = _var_int(last, _NODES_VARS)
    world = _var_int(last, ("WORLD_SIZE",))
    if nproc is not None and nnodes is not None:
        if world is not None and world != nproc * nnodes:
            parsed.notes.append(f"WORLD_SIZE={world} differs from {nnodes} nodes x {nproc} "
                                "processes; using the latter, which is what torchrun launches")
        return nproc, nproc * nnodes
    return nproc, world


def _model(ints: dict[str, int], flags: set[str], path: Path, parsed: ParsedConfig) -> Model | None:
    """The model described by the script's architecture flags, if they are all present."""
    present = [k for k in _MODEL_KEYS if k in ints]
    if not present:
        return None
    if len(present) < len(_MODEL_KEYS):
        missing = ", ".join("--" + k.replace("_", "-") for k in _MODEL_KEYS if k not in ints)
        parsed.notes.append(f"model flags incomplete (missing {missing}); pass --model")
        return None
    hidden = ints["hidden_size"]
    gated = "swiglu" in flags
    # Megatron's default FFN size: 4h, or 2/3 of it rounded down to 64 with SwiGLU
    # (megatron/training/arguments.py).
    ffn = ints.get("ffn_hidden_size") or (int(4 * hidden * 2 / 3 / 64) * 64 if gated
                                          else 4 * hidden)
    vocab = ints.get("padded_vocab_size") or ints.get("vocab_size")
    if vocab is None:
        vocab = DEFAULT_VOCAB_SIZE
        parsed.notes.append(f"no --vocab-size in the script; assumed {DEFAULT_VOCAB_SIZE}")
    fields: dict[str, object] = {
        "name": re.sub(r"[^A-Za-z0-9._+-]", "-", path.stem).lstrip("-._+") or "megatron-model",
        "num_layers": ints["num_layers"], "hidden_size": hidden,
        "num_attention_heads": ints["num_attention_heads"], "ffn_hidden_size": ffn,
        "gated_mlp": gated, "vocab_size": vocab, "tied_embeddings": "untie" not in flags,
        "head_dim": ints.get("head_dim"), "max_seq_len": ints.get("max_position_embeddings"),
    }
    if "group_query_attention" in flags:
        fields["num_kv_heads"] = ints.get("num_query_groups", 1)
    if "num_experts" in ints:
        moe: dict[str, object] = {
            "num_experts": ints["num_experts"], "top_k": ints.get("moe_topk", DEFAULT_MOE_TOPK),
            "expert_ffn_hidden_size": ints.get("moe_ffn_hidden_size", ffn)}
        if "shared_expert_ffn_hidden_size" in ints:
            moe["num_shared_experts"] = 1
            moe["shared_expert_ffn_hidden_size"] = ints["shared_expert_ffn_hidden_size"]
        fields["moe"] = moe
    return validated(Model, fields, f"{path} (model flags)")
