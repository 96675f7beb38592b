"""Read a torchtitan TOML job config (releases up to v0.2.x) into a ParsedConfig.

torchtitan's mesh is ``(pp, dp_replicate, dp_shard, cp, tp)`` outermost first (docs/sources.md
7.2), i.e. placer's order ``tp-cp-dp-pp`` with dp = dp_replicate x dp_shard. ``dp_shard = -1``
takes the ranks the other degrees leave, so dp stays unset and is derived from the world size.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from placer.check.parsed import FP4_AS_FP8, ParsedConfig, Recompute, Settings
from placer.check.torchtitan_flavors import flavor_model
from placer.dialects import torchtitan
from placer.dialects.base import version_key
from placer.errors import PlacerError
from placer.mesh import parse_order
from placer.spec.presets import model_names
from placer.spec.stack import load_stack, stack_names

TORCHTITAN_ORDER = torchtitan.ORDER.text
_DEGREES = torchtitan.DEGREES


def _load_toml(path: Path, text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        raise PlacerError(f"{path}: reading TOML needs Python 3.11 or newer (tomllib)") from None
    try:
        return tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer of more than 4300 digits
        raise PlacerError(f"{path}: invalid TOML: {str(exc).split(';')[0]}") from None
    except RecursionError:
        raise PlacerError(f"{path}: invalid TOML: nested too deeply") from None


def key_lines(text: str) -> dict[str, int]:
    """``section.key`` -> 1-based line of its assignment, for GitHub annotations."""
    lines: dict[str, int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        header = re.match(r"^\[([^\[\]]+)\]", stripped)
        if header:
            section = header.group(1).strip()
            continue
        key = re.match(r"^([A-Za-z0-9_\-\"']+)\s*=", stripped)
        if key:
            lines.setdefault(f"{section}.{key.group(1).strip(chr(34) + chr(39))}", number)
    return lines


def _int(table: dict[str, Any], key: str, path: Path, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlacerError(f"{path}: {key} = {value!r} is not an integer")
    return value


def _degree_tables(data: dict[str, Any], path: Path) -> list[tuple[str, dict[str, Any]]]:
    """Where each release keeps its degrees, newest last so it wins: the 2024 releases under
    ``[training]`` (data_parallel_degree, tensor_parallel_degree) and ``[experimental]``
    (pipeline_parallel_degree, context_parallel_degree), v0.1+ under ``[parallelism]``."""
    tables = []
    for section in ("training", "experimental", "parallelism"):
        table = data.get(section) or {}
        if not isinstance(table, dict):
            raise PlacerError(f"{path}: [{section}] must be a table")
        tables.append((section, table))
    return tables


def parse_torchtitan(path: Path, text: str) -> ParsedConfig:
    data = _load_toml(path, text)
    where = key_lines(text)
    parsed = ParsedConfig(path=str(path), kind="torchtitan", order=parse_order(TORCHTITAN_ORDER))
    tables = _degree_tables(data, path)
    training = dict(tables[0][1])
    par: dict[str, Any] = {}
    section_of: dict[str, str] = {}
    for section, table in tables:
        for key, value in table.items():
            if key in _DEGREES or key.startswith("data_parallel") or key in (
                    "enable_sequence_parallel", "pipeline_parallel_microbatch_size"):
                par[key] = value
                section_of[key] = section
    parsed.recognised = bool(par)
    s = Settings()
    for key, name in _DEGREES.items():
        value = _int(par, key, path, 1)
        if value < 1:
            raise PlacerError(f"{path}: {section_of.get(key, 'parallelism')}.{key} = {value} "
                              "must be at least 1")
        setattr(s, name, value)
        if key in section_of:
            line = where.get(f"{section_of[key]}.{key}")
            if line is not None:
                parsed.lines[name] = line
    if s.ep > 1 or "expert_tensor_parallel_degree" in par:
        s.etp = _int(par, "expert_tensor_parallel_degree", path, 1)
    replicate = _int(par, "data_parallel_replicate_degree", path, 1)
    # data_parallel_degree: the 2024 name of the FSDP degree (-1: the ranks left over)
    shard = _int(par, "data_parallel_shard_degree", path,
                 _int(par, "data_parallel_degree", path, -1))
    if replicate < 1 or (shard < 1 and shard != -1):
        raise PlacerError(f"{path}: data-parallel degrees must be positive (shard may be -1)")
    for key in ("data_parallel_shard_degree", "data_parallel_degree",
                "data_parallel_replicate_degree"):
        if key in section_of:
            parsed.lines.setdefault("dp", where.get(f"{section_of[key]}.{key}", 1))
    if shard == -1:
        s.dp_replicate = replicate
    else:
        s.dp = replicate * shard
    s.zero_stage = fsdp_zero_stage(shard, s.cp)
    # [parallelism] from torchtitan@785c34c (Mar 2025); [training] in the releases before it
    for section in ("parallelism", "training"):
        table = dict(tables)[section]
        if RESHARD_KEY in table:
            if f"{section}.{RESHARD_KEY}" in where:
                parsed.lines["reshard_after_forward"] = where[f"{section}.{RESHARD_KEY}"]
            read_reshard(s, parsed, table[RESHARD_KEY], section)
            break
    s.sequence_parallel = s.tp > 1 and bool(par.get("enable_sequence_parallel", True))
    local = training.get("local_batch_size", training.get("batch_size"))
    if _positive(local):
        s.local_batch_size = local
    per_stage = (tables[2][1] or {}).get("pipeline_parallel_layers_per_stage")
    if _positive(per_stage) and s.pp > 1:
        s.layers_per_virtual_stage = per_stage  # torchtitan: virtual stages of N layers
    micro = par.get("pipeline_parallel_microbatch_size", 1) if s.pp != 1 else local
    if _positive(micro):
        s.micro_batch_size = micro
    converters = (data.get("model") or {}).get("converters") or []
    # 0.2's options under [quantize.linear.float8]; 0.1's under [float8], whose
    # enable_float8_linear switched FP8 on before converters existed (2024)
    float8 = data.get("float8") if isinstance(data.get("float8"), dict) else {}
    quantize = (((data.get("quantize") or {}).get("linear") or {}).get("float8") or {})
    options = quantize if isinstance(quantize, dict) and quantize else float8
    if float8.get("enable_float8_linear"):
        converters = [*converters, "float8"]
    if "model.converters" in where:
        parsed.lines["fp8_recipe"] = where["model.converters"]
    read_fp8(s, parsed, [str(c) for c in converters], options)
    s.compile_components = _compiled(data, training, where, parsed)
    checkpoint = data.get("activation_checkpoint") or {}
    if not isinstance(checkpoint, dict):
        raise PlacerError(f"{path}: [activation_checkpoint] must be a table")
    for key, setting in (("mode", "recompute"), ("selective_ac_option", "recompute_every")):
        if f"activation_checkpoint.{key}" in where:
            parsed.lines[setting] = where[f"activation_checkpoint.{key}"]
    read_recompute(s, parsed, checkpoint.get("mode", "selective"),
                   checkpoint.get("selective_ac_option", DEFAULT_AC_OPTION))
    s.stack = torchtitan_stack(parsed, python_config=False)
    parsed.settings = s
    seq_len = training.get("seq_len")
    parsed.seq_len = seq_len if _positive(seq_len) else None
    gbs = training.get("global_batch_size")
    parsed.global_batch_size = gbs if _positive(gbs) else None
    model = data.get("model") or {}
    parsed.model_ref = preset_for(model)
    if "model.flavor" in where:
        parsed.lines["model"] = where["model.flavor"]
    if parsed.model_ref is None:
        parsed.model = flavor_model(str(model.get("name", "")), str(model.get("flavor", "")))
    if parsed.model_ref:
        parsed.notes.append(f"model from [model] name/flavor: preset {parsed.model_ref}")
    elif parsed.model is not None:
        parsed.notes.append(f"model from [model] name/flavor: torchtitan's {parsed.model.name}")
    elif model.get("name") or model.get("flavor"):
        parsed.model_problem = (f"[model] name = {model.get('name')!r}, flavor = "
                                f"{model.get('flavor')!r} is not a model placer knows")
    return parsed


COMPILE_COMPONENTS = ("model", "loss")
"""torchtitan's compile.components default (torchtitan@08b8b244f config/job_config.py Compile
and 0.3's config/configs.py CompileConfig): each TransformerBlock, and the loss."""


def _compiled(data: dict[str, Any], training: dict[str, Any], where: dict[str, int],
              parsed: ParsedConfig) -> tuple[str, ...]:
    """What the config torch.compiles: ``[compile] enable`` with its ``components`` (from
    torchtitan@08b8b244f, Aug 2025, so every 0.2 release), else the older ``[training] compile``,
    which compiled each block and, from torchtitan@bbb1b616e (Apr 2025; components/loss.py
    build_cross_entropy_loss) until the key moved, the loss. A file with the ``[parallelism]``
    table (torchtitan@785c34c, Mar 2025, the v0.1 layout) is read as compiling the loss too; a
    2024 file (degrees under ``[training]``) as compiling the blocks only (torchtitan@9dec370
    train.py has the loss compile commented out)."""
    table = data.get("compile")
    if isinstance(table, dict) and "enable" in table:
        if "compile.enable" in where:
            parsed.lines["torch_compile"] = where["compile.enable"]
        if table.get("enable") is not True:
            return ()
        components = table.get("components", list(COMPILE_COMPONENTS))
        if not isinstance(components, list):
            return ()
        return tuple(c for c in COMPILE_COMPONENTS if c in components)
    if training.get("compile") is not True:
        return ()
    if "training.compile" in where:
        parsed.lines["torch_compile"] = where["training.compile"]
    if isinstance(data.get("parallelism"), dict):
        parsed.notes.append("torch.compile: [training] compile of a file with [parallelism] "
                            "(torchtitan from Mar 2025): the blocks and, as from Apr 2025 "
                            "(bbb1b616e), the loss")
        return COMPILE_COMPONENTS
    parsed.notes.append("torch.compile: [training] compile of a 2024 file (degrees under "
                        "[training]): the blocks only, not yet the loss")
    return ("model",)


DEFAULT_AC_OPTION = "2"
"""``selective_ac_option`` when a file leaves it out: every second block (torchtitan@3227d50
config_manager.py, default "2"; v0.1 @f7084fc and 0.2.2 @73a0e69 config/job_config.py
ActivationCheckpoint, whose ``mode`` defaults to "selective")."""

_AC_MODES: dict[str, Recompute] = {"none": "none", "full": "full"}


def read_recompute(s: Settings, parsed: ParsedConfig, mode: object, option: object) -> None:
    """torchtitan's activation checkpointing as torchtitan runs it, into ``s.recompute`` (and
    ``s.recompute_every``): ``none``; ``full`` (each block recomputed whole); ``selective``
    with ``selective_ac_option = "op"``: op-level selective checkpointing (placer's
    ``recompute=op``: saves the matmul, attention and reduce-scatter outputs but every second
    matmul's); ``selective`` with a number N: every Nth block of a rank checkpointed whole, the
    others kept ("0" and "1": every block), counted over the blocks the rank builds
    (torchtitan@3227d50 parallelize_llama.py checkpoint_wrapper, v0.1 @f7084fc and 0.2.2
    distributed/activation_checkpoint.py _apply_ac_to_transformer_block / _apply_layer_sac:
    ``not ac_freq or count % ac_freq == 0``); ``memory_budget`` (0.2; 0.3's MemoryBudgetAC):
    torch.compile's partitioner picks what to save under a budget, priced as op-level SAC.
    What torchtitan refuses at start is a framework-refuses finding."""
    text = str(mode)
    if text in _AC_MODES:
        s.recompute = _AC_MODES[text]
        return
    if text == "memory_budget":
        s.recompute = "op"
        if "model" not in s.compile_components:
            parsed.problems.append((
                "framework-refuses", "recompute", "activation_checkpoint.mode = "
                "'memory_budget' needs the model compiled (torchtitan: 'Memory budget mode "
                "requires model to be compiled'): set [compile] enable = true with 'model' in "
                "components, or use mode 'selective' or 'full'"))
        parsed.notes.append("activation checkpointing: memory_budget, where torch.compile's "
                            "partitioner picks what to save: memory priced as op-level "
                            "selective checkpointing (recompute=op)")
        return
    if text != "selective":
        s.recompute = "none"
        parsed.problems.append((
            "framework-refuses", "recompute", f"activation_checkpoint.mode = {mode!r}: "
            "torchtitan accepts 'none', 'selective', 'full' or 'memory_budget' ('Invalid AC "
            "mode'); checked without recomputation"))
        return
    if not isinstance(option, str):
        # torchtitan compares it with "op" and then calls .isdigit() on it
        parsed.problems.append((
            "framework-refuses", "recompute_every", f"activation_checkpoint."
            f"selective_ac_option = {option!r} is not a string: torchtitan stops on "
            f"{type(option).__name__}.isdigit() (AttributeError); write it quoted, "
            f"selective_ac_option = \"{option}\""))
        option = str(option)
    if option == "op":
        s.recompute = "op"
        return
    if not option.isdigit():
        s.recompute = "op"
        parsed.problems.append((
            "framework-refuses", "recompute_every", f"activation_checkpoint."
            f"selective_ac_option = {option!r}: torchtitan takes 'op' or a whole number of "
            "blocks ('Invalid selective AC option'); checked as 'op'"))
        return
    every = int(option)
    s.recompute = "full"
    if every > 1:
        s.recompute_every = every
    parsed.notes.append(
        f"activation checkpointing: selective, selective_ac_option = '{option}': "
        + ("every block recomputed whole (recompute=full)" if every <= 1 else
           f"blocks {every}, {2 * every}, ... of each rank recomputed whole, the others kept"))


def torchtitan_stack(parsed: ParsedConfig, python_config: bool) -> str:
    """The torchtitan stack preset whose defaults (eager PyTorch modules, SDPA's flash
    attention, FSDP2's fp32 master) price the config's memory: the newest preset of the
    releases the file's format implies (TOML: up to 0.2, dialects.torchtitan.LAST_TOML; Python
    configs: 0.3 and newer), else the newest torchtitan preset, said in a note."""
    presets = sorted((n for n in stack_names() if n.partition("@")[0] == "torchtitan"),
                     key=lambda n: version_key(n.partition("@")[2]))
    last_toml = version_key(torchtitan.LAST_TOML)
    fitting = [n for n in presets
               if (version_key(n.partition("@")[2]) > last_toml) == python_config]
    releases = ("Python configs, torchtitan 0.3 and newer" if python_config
                else f"TOML configs, torchtitan up to {torchtitan.LAST_TOML}")
    name = fitting[-1] if fitting else presets[-1]
    kernels = ("fused kernels" if load_stack(name).defaults.fused_kernels
               else "eager PyTorch modules")
    why = (f"the torchtitan preset for {releases}" if fitting else
           f"the newest torchtitan preset; placer has none for {releases}")
    parsed.notes.append(f"stack {name} ({why}): memory priced with its {kernels}")
    return name


def read_fp8(s: Settings, parsed: ParsedConfig, converters: list[str],
             float8: dict[str, Any], default_recipe: str = "tensorwise") -> None:
    """FP8 from torchtitan's model converters (dialects.torchtitan.CONVERTER_KINDS) and the
    float8 converter's options: recipe_name (unset: ``default_recipe``, tensorwise in 0.1-0.2,
    rowwise in 0.3, dialects.torchtitan.DEFAULT_FP8_RECIPE) and FSDP float8 all-gather
    (tensorwise only)."""
    kinds = {torchtitan.CONVERTER_KINDS.get(c) for c in converters} - {None}
    if not kinds:
        return
    s.precision = "fp8"
    if "nvfp4" in kinds:
        parsed.notes.append(f"NVFP4 converter: {FP4_AS_FP8}")
        return
    if "mx" in kinds:
        s.fp8_recipe = "mxfp8"
        return
    recipe = float8.get("recipe_name") or default_recipe
    if recipe == "tensorwise":
        s.fp8_recipe = "tensorwise"
        s.fp8_param_gather = bool(float8.get("enable_fsdp_float8_all_gather"))
    elif recipe == "rowwise":
        s.fp8_recipe = "rowwise"
    else:
        parsed.notes.append(f"float8 recipe_name {recipe!r}: not a recipe placer models; "
                            "priced as per-tensor-scaled FP8")


RESHARD_KEY = "fsdp_reshard_after_forward"
RESHARD_POLICIES: dict[str, bool | None] = {"default": None, "always": True, "never": False}
"""torchtitan's ``fsdp_reshard_after_forward`` as Layout.reshard_after_forward. torchtitan
resolves the policy once for every block and the embedding (0.2.2 @73a0e69
models/llama3/infra/parallelize.py apply_fsdp, 0.3 distributed/fsdp.py
get_fsdp_reshard_after_forward_policy): "always" True, "never" False, "default" ``not
pp_enabled``, which is Layout's own default (None: on without pipelining, off under it). The
``[norm, output]`` unit reshards only under "always" and the root ``fully_shard(model)`` holds
no parameters of its own; those are the cost model's (memory._zero3_transient)."""


def read_reshard(s: Settings, parsed: ParsedConfig, policy: object, section: str) -> None:
    """``fsdp_reshard_after_forward`` into ``s.reshard_after_forward`` when torchtitan applies
    FSDP (``s.zero_stage`` 3; without FSDP the policy is never read). Another value stops
    torchtitan in apply_fsdp (``ValueError: Invalid reshard_after_forward_policy``): a
    framework-refuses finding, checked as "default"."""
    if s.zero_stage < 3:
        return
    if isinstance(policy, str) and policy in RESHARD_POLICIES:
        s.reshard_after_forward = RESHARD_POLICIES[policy]
        if policy != "default":
            kept = "freed after each forward" if policy == "always" else (
                "kept gathered from the forward through the backward")
            parsed.notes.append(f"{section}.{RESHARD_KEY} = '{policy}': FSDP parameters {kept}")
        return
    parsed.problems.append((
        "framework-refuses", "reshard_after_forward", f"{section}.{RESHARD_KEY} = {policy!r}: "
        "torchtitan takes 'default', 'always' or 'never' ('Invalid "
        "reshard_after_forward_policy'); checked as 'default'"))


def fsdp_zero_stage(shard: int, cp: int) -> int:
    """torchtitan applies FSDP (full shard, ZeRO-3 equivalent) over dp_shard x cp whenever
    either is above 1 (ParallelDims.fsdp_enabled = dp_shard_enabled or cp_enabled)."""
    return 0 if shard == 1 and cp == 1 else 3


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# torchtitan model names whose placer preset is spelled differently
_PRESET_NAMES = {"deepseek_v3": "deepseek-v3", "llama": "llama2"}  # "llama": early 2024 (Llama 2)


def preset_for(model: dict[str, Any]) -> str | None:
    """torchtitan's ``[model] name = "llama3", flavor = "8B"`` as a placer preset, if one.
    (torchtitan/models/<name>/__init__.py holds the flavors; placer has presets of the ones
    with the same dimensions.)"""
    name, flavor = str(model.get("name", "")).lower(), str(model.get("flavor", "")).lower()
    name = _PRESET_NAMES.get(name, name)
    candidate = f"{name}-{flavor}"
    return candidate if name and flavor and candidate in model_names() else None
