"""Read a Megatron-LM or Megatron-DeepSpeed launch script (or a plain argument list).

The script is evaluated as bash would run it (``shell``), with the scheduler's variables from
``#SBATCH``, ``--nodes`` and ``--env`` (``world``); flags may be ``--flag value`` or
``--flag=value`` in any command, and the last occurrence wins, as with argparse. The world size
comes from the launcher (torchrun / ``torch.distributed.launch`` ``--nproc-per-node`` x
``--nnodes``, ``deepspeed --num_gpus --num_nodes``, ``srun`` tasks), else from ``WORLD_SIZE`` or
``GPUS_PER_NODE`` x ``NNODES``-style variables. A value known only when the job runs is not
guessed: it is listed in ``unresolved`` and the checks that need it are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from placer.check.megatron_flags import (
    BOOL_FLAGS,
    CHOICE_FLAGS,
    INT_FLAGS,
    LAUNCH_ONLY_KEYS,
    LIST_FLAGS,
    MODEL_KEYS,
    PARALLEL_KEYS,
    PRINTING_COMMANDS,
    SHARDING_ZERO,
    all_flags,
)
from placer.check.parse_deepspeed import read_optimizer_wrapper
from placer.check.parsed import FP4_AS_FP8, RECOMPUTE_MODES, ParsedConfig, Settings
from placer.check.shell import UNKNOWN_MARK, Array, Scalar, Script, ShellSyntaxError, Word, evaluate
from placer.check.world import RUNTIME_VARIABLES, sbatch_inputs, sbatch_options
from placer.dialects import megatron
from placer.errors import PlacerError
from placer.mesh import parse_order
from placer.spec.layout import RECOMPUTE_MODULES
from placer.spec.model import Model
from placer.spec.presets import validated
from placer.spec.runtime import ALLOC_CONF_VARIABLES, alloc_conf_expandable
from placer.spec.text import decimal

# Megatron-DeepSpeed's GPTModelPipe partitions with DeepSpeed's 'type:transformer' unless
# --pp-partition-method says otherwise (megatron/model/gpt_model.py, bigscience-workshop/
# Megatron-DeepSpeed 8387ae1); --no-pipeline-parallel uses Megatron's own even split.
DEEPSPEED_DEFAULT_PARTITION = "type:transformer"
# Used when the script gives no --vocab-size / --padded-vocab-size (the tokenizer decides it in
# Megatron); 32000 is the Llama-2 tokenizer's size (placer's llama2 presets).
DEFAULT_VOCAB_SIZE = 32000
# Megatron's --moe-router-topk default (megatron/training/arguments.py).
DEFAULT_MOE_TOPK = 2
_GPUS_VARS = ("GPUS_PER_NODE", "NPROC_PER_NODE", "NGPUS_PER_NODE", "NUM_GPUS_PER_NODE", "NGPU",
              "GPUS_PER_NODE_", "N_GPUS")
_NODES_VARS = ("NNODES", "NUM_NODES", "N_NODES", "NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class _Value:
    text: str | None
    raw: str
    line: int
    why: str | None = None  # why text is None


def read_fp8_recipe(s: Settings, parsed: ParsedConfig, recipe: str | None, key: str) -> None:
    """Transformer Engine's FP8 recipe as Megatron names it (``--fp8-recipe``, a Bridge or
    megatron-core ``fp8_recipe``): one of megatron.FP8_RECIPES, else a note (custom is a user
    recipe class) and priced as FP8."""
    if recipe in megatron.FP8_RECIPES:
        s.fp8_recipe = recipe  # type: ignore[assignment]
    elif recipe is not None:
        parsed.notes.append(f"{key} {recipe}: not a recipe placer models "
                            f"({', '.join(megatron.FP8_RECIPES)}); priced as FP8")


def parse_megatron(path: Path, text: str, inputs: Mapping[str, str] | None = None
                   ) -> ParsedConfig:
    """Settings of a Megatron launch script; what cannot be known statically is ``unresolved``."""
    header = sbatch_options(text)
    env, header_notes = sbatch_inputs(header)
    env.update(inputs or {})
    try:
        script = evaluate(text, env, RUNTIME_VARIABLES, path.resolve().parent)
    except ShellSyntaxError as exc:
        raise PlacerError(f"{path}: not a bash script this reader follows: {exc}") from None
    values, bools, notes = _flag_values(script.words)
    sourced = not values and not bools
    if sourced:
        # No command uses a flag: an argument file meant to be sourced (placer's own
        # megatron_args.sh): read the flags its arrays and strings hold.
        values, bools, notes = _flag_values(_defined_words(script))
        if values or bools:
            notes.append("no command in the file uses its flags: read as an argument file to "
                         "be sourced (its arrays and strings, in order)")
    deepspeed = bool({"deepspeed", "partition_method", "deepspeed_config"} & (
        set(bools) | {CHOICE_FLAGS.get(f) for f in values}))
    parsed = ParsedConfig(path=str(path), kind="megatron-deepspeed" if deepspeed else "megatron")
    parsed.notes += header_notes + notes + script.notes
    ints: dict[str, int] = {}
    for flag, key in INT_FLAGS.items():
        if flag not in values:
            continue
        parsed.lines.setdefault(key, values[flag].line)
        number = _int(values[flag], flag, path, parsed, key)
        if number is not None:
            ints[key] = number
    choices: dict[str, str] = {}
    for flag, key in CHOICE_FLAGS.items():
        if flag in values:
            parsed.lines.setdefault(key, values[flag].line)
            if values[flag].text is not None:
                choices[key] = values[flag].text or ""
    for flag, line in bools.items():
        parsed.lines.setdefault(BOOL_FLAGS[flag], line)
    flags = {BOOL_FLAGS[flag] for flag in bools}
    parsed.settings = _settings(ints, flags, choices, parsed)
    _allocator(script, env, parsed, sourced)
    default_order, tp_pp_dp_order = megatron.ORDERS
    parsed.order = parse_order(tp_pp_dp_order.text if "tp_pp_dp_mapping" in flags
                               else default_order.text)
    parsed.seq_len = ints.get("seq_len")
    parsed.global_batch_size = ints.get("global_batch_size")
    # launcher and precision flags alone (launch.sh, env.sh) are no parallel settings
    parsed.recognised = bool((set(ints) | flags | set(choices) | set(parsed.unresolved))
                             - set(LAUNCH_ONLY_KEYS))
    _world(ints, flags, script, parsed)
    parsed.model = _model(ints, flags, path, parsed)
    return parsed


def _allocator(script: Script, env: Mapping[str, str], parsed: ParsedConfig,
               sourced: bool) -> None:
    """Whether the commands the script starts see expandable segments: the allocator variables
    it was started with (``--env``, the batch header) or exports, at their final values. An
    argument file that sets neither (placer's megatron_args.sh, which launch.sh sources after
    env.sh) starts nothing: its launcher decides (None)."""
    environment: dict[str, str] = {}
    for name in ALLOC_CONF_VARIABLES:
        value = script.value(name)
        if value is not None and (name in env or name in script.exported):
            environment[name] = value
            item = script.variables.get(name)
            if isinstance(item, Scalar) and item.line:
                parsed.lines.setdefault("expandable_segments", item.line)
    parsed.settings.expandable_segments = (
        None if sourced and not environment else alloc_conf_expandable(environment))


def _defined_words(script: Script) -> list[Word]:
    """The words of every array, and of every string holding a flag, in assignment order."""
    words: list[Word] = []
    for name, value in script.variables.items():
        if isinstance(value, Array):
            for text, line in value.items:
                for piece in text.split():
                    words.append(Word(None if UNKNOWN_MARK in piece else piece, piece, line,
                                      name))
        elif isinstance(value, Scalar) and "--" in value.text:
            for piece in value.text.split():
                words.append(Word(None if UNKNOWN_MARK in piece else piece, piece, value.line,
                                  name))
    return words


def _flag_values(all_words: list[Word]) -> tuple[dict[str, _Value], dict[str, int], list[str]]:
    """The last value of every flag of interest, the boolean flags set, and notes."""
    known = all_flags()
    values: dict[str, _Value] = {}
    bools: dict[str, int] = {}
    notes: list[str] = []
    words = [w for w in all_words
             if (w.command or "").rsplit("/", 1)[-1] not in PRINTING_COMMANDS]
    for i, word in enumerate(words):
        if word.text is None:
            _unknown_word(word, known, values)
            continue
        if not word.text.startswith("--"):
            continue
        name, eq, inline = word.text[2:].partition("=")
        name = name.replace("_", "-") if name.replace("_", "-") in known else name
        if name not in known:
            continue
        if name in BOOL_FLAGS:
            if word.conditional is not None:
                notes.append(f"line {word.line}: --{name} is set only if the condition of line "
                             f"{word.conditional} holds; not applied")
                continue
            bools[name] = word.line
            continue
        nxt = words[i + 1] if i + 1 < len(words) else None
        if eq:
            raw, value, why = inline, inline, None
        elif name in LIST_FLAGS and nxt is not None:
            items = [w for w in words[i + 1:i + 16]]
            stop = next((k for k, w in enumerate(items) if (w.text or "").startswith("--")),
                        len(items))
            known_items = [w.text for w in items[:stop]]
            raw = " ".join(w.raw for w in items[:stop])
            value = None if None in known_items else " ".join(t or "" for t in known_items)
            why = None if value is not None else "holds a value known only when the job runs"
        elif nxt is not None and not (nxt.text or "").startswith("--"):
            raw, value = nxt.raw, nxt.text
            why = None if value is not None else (f"takes its value from {nxt.raw}, known only "
                                                  "when the job runs")
        else:
            raise PlacerError(f"line {word.line}: --{name} has no value")
        if word.conditional is not None:
            previous = values.get(name)
            if previous is not None and previous.text == value:
                continue
            value, why = None, (f"set only if the condition of line {word.conditional} holds "
                                "(not known without running the script)")
        values[name] = _Value(value, raw, word.line, why)
    return values, bools, notes


def _unknown_word(word: Word, known: set[str], values: dict[str, _Value]) -> None:
    """A word known only at run time that visibly holds a flag: ``--tp=$TP`` with TP unset."""
    for match in re.finditer(r"--([A-Za-z0-9_-]+)", word.raw):
        name = match.group(1).replace("_", "-")
        if name in known and name not in BOOL_FLAGS:
            values[name] = _Value(None, word.raw, word.line,
                                  f"{word.raw} is known only when the job runs")


def _int(value: _Value, flag: str, path: Path, parsed: ParsedConfig, key: str) -> int | None:
    if value.text is None:
        if key in PARALLEL_KEYS:
            parsed.unresolved[key] = f"line {value.line}: --{flag} {value.why}"
        elif key in MODEL_KEYS:
            parsed.model_problem = f"line {value.line}: --{flag} {value.why}"
        else:
            parsed.notes.append(f"line {value.line}: --{flag} {value.why}; ignored")
        return None
    text = value.text.strip()
    if flag == "nnodes" and ":" in text:
        low, _, high = text.partition(":")
        if low != high:
            parsed.unresolved[key] = (f"line {value.line}: --nnodes {text} is elastic: the node "
                                      "count is known only when the job runs")
            return None
        text = high
    if flag == "nproc-per-node" and text in ("gpu", "auto", "cuda"):
        return None
    number = decimal(text)
    if number is None or number < (0 if key in ("offload_layers", "zero_stage") else 1):
        raise PlacerError(f"{path}:{value.line}: --{flag} {value.raw!r} is not a positive integer")
    return number


def _settings(ints: dict[str, int], flags: set[str], choices: dict[str, str],
              parsed: ParsedConfig) -> Settings:
    s = Settings()
    for key in ("tp", "pp", "cp", "ep"):
        if key in ints:
            setattr(s, key, ints[key])
    for key in ("vpp", "micro_batch_size", "layers_per_virtual_stage", "first_stage_layers",
                "last_stage_layers"):
        if key in ints:
            setattr(s, key, ints[key])
    s.pp_layout = choices.get("pp_layout")
    if "num_experts" in ints or s.ep > 1:
        # Megatron's --expert-tensor-parallel-size defaults to the TP size (docs/sources.md 6.2).
        s.etp = ints.get("etp", s.tp)
    elif "etp" in ints:
        s.etp = ints["etp"]
    # Megatron turns --sequence-parallel off when TP is 1 (docs/sources.md 6.2).
    s.sequence_parallel = "sequence_parallel" in flags and s.tp > 1
    if "recompute_activations" in flags:
        s.recompute = "selective"
    if "checkpoint_activations" in flags:
        # the pre-2022 name of full recomputation (Megatron-DeepSpeed megatron/arguments.py)
        s.recompute = "full"
    if choices.get("recompute") in ("full", "selective"):
        s.recompute = RECOMPUTE_MODES[choices["recompute"]]
    if s.recompute == "selective" and "recompute_modules" in choices:
        modules = choices["recompute_modules"].split()
        s.recompute_modules = tuple(m for m in RECOMPUTE_MODULES if m in modules)
        unknown = sorted(set(modules) - set(RECOMPUTE_MODULES))
        if unknown:
            parsed.notes.append(f"--recompute-modules {' '.join(unknown)}: not modules placer "
                                f"models ({', '.join(RECOMPUTE_MODULES)}); ignored")
    if s.recompute == "full" and choices.get("recompute_method") == "block":
        s.recompute_layers = ints.get("recompute_layers")
    zero = 3 if "fsdp" in flags else 1 if "distributed_optimizer" in flags else 0
    zero = ints.get("zero_stage", zero)
    s.zero_stage = SHARDING_ZERO.get(choices.get("sharding_strategy") or "", zero)
    s.offload_layers = ints.get("offload_layers", 0)
    s.embedding_in_split = "embedding_in_split" in flags
    s.loss_in_split = "loss_in_split" in flags
    if parsed.kind == "megatron-deepspeed" and "no_pipeline_parallel" not in flags:
        s.partition_method = choices.get("partition_method", DEEPSPEED_DEFAULT_PARTITION)
    if "fp8" in flags or choices.get("fp8_format") in ("hybrid", "e4m3"):
        s.precision = "fp8"
    if choices.get("fp4_format") is not None:  # Megatron-LM's --fp4-format e2m1 (NVFP4)
        s.precision = "fp8"
        parsed.notes.append(f"--fp4-format {choices['fp4_format']}: {FP4_AS_FP8}")
    s.fp8_param_gather = "fp8_param_gather" in flags and s.precision == "fp8"
    if s.precision == "fp8":
        read_fp8_recipe(s, parsed, choices.get("fp8_recipe"), "--fp8-recipe")
    s.grad_reduce_bf16 = "grad_reduce_bf16" in flags
    s.optimizer_offload = "optimizer_offload" in flags
    if parsed.kind == "megatron-deepspeed" and "deepspeed" in flags:
        # Megatron-DeepSpeed builds a PipelineModule unless --no-pipeline-parallel.
        read_optimizer_wrapper(parsed, s, s.zero_stage,
                               "bf16" if "bf16" in flags else "fp16" if "fp16" in flags
                               else "fp32", pipeline="no_pipeline_parallel" not in flags)
        if s.deepspeed_optimizer == "BF16_Optimizer" and s.zero_stage == 0:
            # BF16_Optimizer partitions the fp32 master weights and optimizer state over the
            # data-parallel group itself (BigScience tr11: "bf16 must use z0! it implements
            # its own zero stage 1 equivalent"), so it is checked as ZeRO-1.
            s.zero_stage = 1
            parsed.notes.append("its BF16_Optimizer shards the optimizer state like ZeRO-1; "
                                "checked as zero=1")
    # Megatron's --cross-entropy-fusion-impl (native, te) picks the kernel of
    # --cross-entropy-loss-fusion; without the fusion flag the unfused vocab-parallel loss runs.
    if "cross_entropy_fusion" in flags and choices.get("cross_entropy_impl") == "te":
        s.cross_entropy_impl = "te"
    return s


def _var_int(script: Script, names: tuple[str, ...]) -> tuple[int | None, str | None]:
    """The first of ``names`` set to a positive integer by the end of the script."""
    for name in names:
        number = decimal((script.value(name) or "").strip())
        if number:
            return number, name
    return None, None


def _launchers(script: Script) -> set[str]:
    found: set[str] = set()
    for word in script.words:
        command = (word.command or "").rsplit("/", 1)[-1]
        if command in ("torchrun", "deepspeed", "srun", "mpirun", "mpiexec"):
            found.add(command)
        if word.text in _TORCHRUN:
            found.add("torchrun")
    return found


def _world(ints: dict[str, int], flags: set[str], script: Script, parsed: ParsedConfig) -> None:
    """Processes per node and world size from the launcher, else the script's variables."""
    launchers = _launchers(script)
    nproc = ints.get("nproc_per_node")
    nnodes = 1 if "standalone" in flags else ints.get("nnodes")
    if "srun" in launchers and not launchers & {"torchrun", "deepspeed"}:
        # srun starts one process per task: tasks per node x nodes (sbatch(1))
        tasks, _ = _var_int(script, ("SLURM_NTASKS_PER_NODE",))
        nproc = nproc or tasks
    if nproc is None and "nproc_per_node" not in parsed.unresolved:
        nproc, _ = _var_int(script, _GPUS_VARS)
    if nnodes is None and "nnodes" not in parsed.unresolved:
        nnodes, name = _var_int(script, _NODES_VARS)
        if nnodes is None and not launchers & {"torchrun", "deepspeed", "srun"}:
            world, wname = _var_int(script, ("WORLD_SIZE",))
            if world is not None:
                parsed.world_size, parsed.world_source = world, f"${wname}"
                parsed.nproc_per_node = nproc
                return
    if "deepspeed" in launchers and nnodes is None and "nnodes" not in parsed.unresolved \
            and ints.get("nproc_per_node") is not None:
        nnodes = 1  # deepspeed without --num_nodes/--hostfile runs on the local node
    if "torchrun" in launchers:
        # torchrun's defaults: --nnodes 1:1 and --nproc-per-node 1 (torch/distributed/run.py)
        if nnodes is None and "nnodes" not in parsed.lines and "nnodes" not in parsed.unresolved:
            nnodes = 1
        if nproc is None and "nproc_per_node" not in parsed.lines:
            nproc = 1
    parsed.nproc_per_node = nproc
    if nproc is not None and nnodes is not None:
        parsed.world_size = nproc * nnodes
        parsed.world_source = f"{nnodes} node(s) x {nproc} processes"
        world, _ = _var_int(script, ("WORLD_SIZE",))
        if world is not None and world != parsed.world_size:
            parsed.notes.append(f"WORLD_SIZE={world} differs from {nnodes} nodes x {nproc} "
                                "processes; using the latter, which is what the launcher starts")
    elif nnodes is None and "nnodes" not in parsed.unresolved:
        parsed.unresolved["world"] = ("the node count is not in the script (no launcher "
                                      "--nnodes, #SBATCH --nodes or NNODES)")
    elif nnodes is not None and "nproc_per_node" not in parsed.unresolved:
        parsed.nodes = nnodes


# Megatron-LM's MLA defaults (core_v0.16.1 arguments.py _add_mla_args L2725-2733; --q-lora-rank
# None: no query compression).
_MLA_DEFAULTS = {"kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                 "v_head_dim": 128}


def _mla(ints: dict[str, int]) -> dict[str, object]:
    """Model fields of --multi-latent-attention: the query/key head is --qk-head-dim (no rotary)
    plus --qk-pos-emb-head-dim wide, as MLATransformerConfig documents q_head_dim."""
    got = {k: ints.get(k, default) for k, default in _MLA_DEFAULTS.items()}
    return {"head_dim": got["qk_head_dim"] + got["qk_pos_emb_head_dim"],
            "mla": {"q_lora_rank": ints.get("q_lora_rank"), "kv_lora_rank": got["kv_lora_rank"],
                    "qk_rope_head_dim": got["qk_pos_emb_head_dim"],
                    "v_head_dim": got["v_head_dim"]}}


def _model(ints: dict[str, int], flags: set[str], path: Path, parsed: ParsedConfig
           ) -> Model | None:
    """The model described by the script's architecture flags, if they are all present."""
    present = [k for k in MODEL_KEYS if k in ints]
    if not present:
        return None
    if len(present) < len(MODEL_KEYS):
        missing = ", ".join("--" + k.replace("_", "-") for k in MODEL_KEYS if k not in ints)
        parsed.notes.append(f"model flags incomplete (missing {missing})")
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
        "linear_bias": "disable_bias_linear" not in flags,
    }
    if "group_query_attention" in flags:
        fields["num_kv_heads"] = ints.get("num_query_groups", 1)
    if "multi_latent_attention" in flags:
        fields.update(_mla(ints))
    if "num_experts" in ints and ints["num_experts"] > 1:
        moe: dict[str, object] = {
            "num_experts": ints["num_experts"], "top_k": ints.get("moe_topk", DEFAULT_MOE_TOPK),
            "expert_ffn_hidden_size": ints.get("moe_ffn_hidden_size", ffn)}
        if "shared_expert_ffn_hidden_size" in ints:
            moe["num_shared_experts"] = 1
            moe["shared_expert_ffn_hidden_size"] = ints["shared_expert_ffn_hidden_size"]
        fields["moe"] = moe
    return validated(Model, fields, f"{path} (model flags)")
