"""torchtitan's job config: the TOML of releases 0.1-0.2 and the Python config of 0.3.

Field names are torchtitan's ``JobConfig`` / ``ParallelismConfig`` dataclass fields
(docs/sources.md 7.2). torchtitan's mesh is ``(pp, dp_replicate, dp_shard, cp, tp)`` outermost
first, i.e. placer's order ``tp-cp-dp-pp`` with dp = dp_replicate x dp_shard.

Version rules, read from the released packages (pytorch/torchtitan on PyPI):

- 0.1.0 has no ``expert_parallel_degree`` field, so an ep > 1 plan cannot be written for it;
  uneven stages are given as ``pipeline_parallel_split_points``.
- 0.2.0-0.2.2 refuse ``pipeline_parallel_split_points`` (``Invalid field names``); stages are
  given as ``module_fqns_per_model_part`` (one list of module names per model chunk, the last
  chunk ending with ``norm``, ``output``) or as ``pipeline_parallel_layers_per_stage``.
- 0.3.0 configs are Python (``--module M --config F`` loads ``F()`` from module ``M``); the
  output projection is named ``lm_head`` (``_generate_llm_fqn_per_model_part``); CUDA graphs
  are on by default and refused with pipeline parallelism (``disable_cuda_graphs``).
- In every release ``pipeline_parallel_layers_per_stage`` counts the embedding and the output
  as ``pipeline_parallel_first/last_stage_less_layers`` layers (default 1 each), so placer sets
  both to 0 when it gives a per-stage layer count.
- ``ParallelDims`` accepts expert tensor parallelism equal to tp or 1 only
  (``"Currently we only support ETP=TP or ETP=1"``), and its sparse mesh
  ``(pp, dp_replicate, efsdp, ep, etp)`` needs ep x etp to divide dp_shard x cp x tp.
"""

from __future__ import annotations

import json

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
from placer.spec import Layout

TARGET = Target("torchtitan", "torchtitan", ("0.1", "0.2", "0.3"), "0.3", "torchtitan")
TOML_FILE = "torchtitan.toml"
PY_FILE = "torchtitan_config.py"
# The newest release series whose configs are TOML; from 0.3 on they are Python.
LAST_TOML = "0.2"
ORDER = RankOrder("tp-cp-dp-pp")
# [parallelism] degree key -> placer dimension, for readers.
DEGREES = {
    "tensor_parallel_degree": "tp",
    "pipeline_parallel_degree": "pp",
    "context_parallel_degree": "cp",
    "expert_parallel_degree": "ep",
    "expert_tensor_parallel_degree": "etp",
}
REPLICATE_KEY = "data_parallel_replicate_degree"
SHARD_KEY = "data_parallel_shard_degree"
RECOMPUTE_MODES = ("none", "selective", "full")
# placer model preset -> torchtitan 0.3 config_registry function of the same architecture.
BASE_CONFIGS = {
    "llama3-8b": "torchtitan.models.llama3.config_registry:llama3_8b",
    "llama3-70b": "torchtitan.models.llama3.config_registry:llama3_70b",
    "llama3-405b": "torchtitan.models.llama3.config_registry:llama3_405b",
    "deepseek-v3": "torchtitan.models.deepseek_v3.config_registry:deepseek_v3_671b",
}

# FP8 training as torchtitan's model converters (torchao), by release:
# - 0.2 (TOML): ``[model] converters`` names registered in components/quantization/float8.py
#   L238-239 and mx.py L171-172 (``quantize.linear.float8``, ``quantize.grouped_mm.float8``,
#   ``quantize.linear.mx``, ``quantize.grouped_mm.mx``), options under ``[quantize.linear.float8]``
#   (config/job_config.py L731-753: recipe_name None is tensorwise scaling, the only recipe with
#   enable_fsdp_float8_all_gather; "rowwise" and "rowwise_with_gw_hp" also), the grouped ones on
#   the modules named in ``fqns``. 0.1 named them ``float8`` / ``mx`` (check reads both).
# - 0.3 (Python): converter classes of torchtitan.components.quantization, applied to the model
#   config (model_registry: ``c.build().convert(config)``); Float8LinearConverter offers
#   rowwise and rowwise_with_gw_hp only (float8.py L58), MXFP8LinearConverter the MX one.
FP8_CONVERTERS = {
    "0.2": {"linear": {"float8": "quantize.linear.float8", "mx": "quantize.linear.mx"},
            "grouped": {"float8": "quantize.grouped_mm.float8", "mx": "quantize.grouped_mm.mx"}},
    "0.3": {"linear": {"float8": "Float8LinearConverter", "mx": "MXFP8LinearConverter"},
            "grouped": {"float8": "Float8GroupedExpertsConverter",
                        "mx": "MXFP8GroupedExpertsConverter"}},
}
# Every converter name or class that quantises linear or expert GEMMs, by kind: the tables
# above, 0.1's ``float8`` / ``mx`` (components/float8.py, components/mx.py
# register_model_converter), and 0.3's NVFP4LinearConverter (components/quantization/nvfp4.py).
CONVERTER_KINDS: dict[str, str] = {
    "float8": "float8", "mx": "mx", "NVFP4LinearConverter": "nvfp4",
    **{name: kind for series in FP8_CONVERTERS.values() for table in series.values()
       for kind, name in table.items()},
}
# The FP8 recipes each release's float8 converter runs (mxfp8 is the mx converter's).
FP8_RECIPES = {"0.2": ("tensorwise", "rowwise", "mxfp8"), "0.3": ("rowwise", "mxfp8")}
# The recipe a job without one gets: torchao's default for the release's float8 converter.
DEFAULT_FP8_RECIPE = {"0.2": "tensorwise", "0.3": "rowwise"}
# torchtitan's MoE module whose grouped GEMMs the grouped converters quantise.
EXPERTS_FQN = "experts"


def _fp8_series(version: str) -> str:
    """The key of FP8_CONVERTERS / FP8_RECIPES for ``version`` (0.2 and newer)."""
    return "0.3" if writes_python(version) else "0.2"


def _converter_kind(recipe: str) -> str:
    return "mx" if recipe == "mxfp8" else "float8"


def fp8_recipe(placed: Placed, version: str) -> str | None:
    """The FP8 recipe torchtitan ``version`` runs for the plan; None under BF16."""
    if placed.plan.job.precision != "fp8":
        return None
    return placed.plan.job.runtime.fp8_recipe or DEFAULT_FP8_RECIPE[_fp8_series(version)]


def fp8_converters(placed: Placed, version: str) -> list[str]:
    """The converters (0.2 names, 0.3 classes) that run the plan's FP8: linear layers, and an
    MoE model's grouped expert GEMMs (placer prices them in FP8 too)."""
    recipe = fp8_recipe(placed, version)
    if recipe is None:
        return []
    table, kind = FP8_CONVERTERS[_fp8_series(version)], _converter_kind(recipe)
    names = [table["linear"][kind]]
    if placed.plan.model.moe is not None:
        names.append(table["grouped"][kind])
    return names


def _fsdp_float8_all_gather(placed: Placed, version: str) -> bool:
    """Whether the 0.2 file turns on FSDP's float8 all-gather for the plan's FP8 weights
    (runtime.fp8_param_gather): tensorwise scaling under FSDP only (enable_fsdp_float8_all_gather,
    the one recipe torchtitan takes it with)."""
    return (placed.plan.job.runtime.fp8_param_gather and not writes_python(version)
            and fp8_recipe(placed, version) == "tensorwise" and placed.layout.zero_stage >= 3)


def fit(placed: Placed) -> OrderFit:
    return order_fit(placed, (ORDER,), "torchtitan")


def toml_series(version: str) -> str:
    """The release series the TOML file is written for (the newest TOML one from 0.3 on)."""
    return version if version_key(version) <= version_key(LAST_TOML) else LAST_TOML


def writes_python(version: str) -> bool:
    return version_key(version) > version_key(LAST_TOML)


def _output_name(version: str) -> str:
    return "lm_head" if writes_python(version) else "output"


def _shard_ep(placed: Placed) -> int:
    layout = placed.layout
    shard = 1 if layout.zero_stage == 0 else layout.dp // layout.zero_replicas
    return shard * layout.cp * layout.tp


def refusals(placed: Placed, version: str, file: str) -> list[Refusal]:
    """What torchtitan ``version`` rejects in this plan, for the file written for it."""
    layout = placed.layout
    out: list[str] = []
    key = version_key(version)
    if layout.ep > 1 and key < version_key("0.2"):
        out.append("has no expert_parallel_degree (added in 0.2.0); use torchtitan 0.2 or newer")
    # 0.3 has no expert tensor parallelism (ParallelDims has no etp; its expert mesh is
    # pp, dp_replicate, efsdp, ep); 0.2 takes etp = tp or 1 ("Currently we only support
    # ETP=TP or ETP=1").
    expert_tp = layout.etp if layout.ep > 1 else 1
    if writes_python(version) and expert_tp > 1:
        out.append(f"has no expert tensor parallelism; the plan has etp={layout.etp}")
    elif expert_tp not in (1, layout.tp):
        out.append(f"supports expert tensor parallelism equal to tp or 1 only (ParallelDims: "
                   f"'Currently we only support ETP=TP or ETP=1'); the plan has etp={layout.etp}"
                   f" with tp={layout.tp}")
    shard = _shard_ep(placed)
    if layout.ep > 1 and shard % (layout.ep * expert_tp):
        out.append(f"needs ep x etp = {layout.ep * expert_tp} to divide data_parallel_shard x cp "
                   f"x tp = {shard} (its expert FSDP mesh efsdp is their quotient); use zero >= 1 "
                   "(FSDP) so dp shards")
    if layout.pp > 1 and layout.pipeline_schedule not in SCHEDULE_NAMES:
        out.append(f"has no {layout.pipeline_schedule} pipeline schedule")
    if layout.zero_stage and layout.dp % layout.zero_replicas:
        out.append(f"shards FSDP over dp_shard x cp and replicates over dp_replicate: "
                   f"{layout.zero_replicas} replicas do not divide dp={layout.dp}")
    if layout.offload_layers:
        out.append("has no activation offloading to host memory (offload_layers)")
    out += _fp8_refusals(placed, version)
    if layout.recompute_layers or layout.recompute_modules:
        out.append("recomputes whole blocks or per op, not chosen layers or modules "
                   "(recompute_layers / recompute_modules are Megatron's)")
    return [Refusal(file, TARGET, version, reason) for reason in out]


def _fp8_refusals(placed: Placed, version: str) -> list[str]:
    recipe = fp8_recipe(placed, version)
    if recipe is None:
        return []
    key, layout = version_key(version), placed.layout
    if key < version_key("0.2"):
        return ["is written with FP8 converters for torchtitan 0.2 and newer only; use "
                "--framework-version torchtitan=0.2 or newer"]
    series = _fp8_series(version)
    if recipe not in FP8_RECIPES[series]:
        return [f"has no FP8 recipe {recipe} (its float8 and mx converters run "
                f"{', '.join(FP8_RECIPES[series])}); set the job's runtime fp8_recipe to one"]
    out = []
    if series == "0.2" and placed.plan.model.moe is not None and recipe != "mxfp8" and (
            layout.pp > 1 or layout.cp > 1):
        # components/quantization/float8.py L193-198 (0.2.2)
        out.append("refuses FP8 MoE training with pipeline or context parallelism ('Float8 MoE "
                   "training prototype does not yet support pipeline parallelism' / 'context "
                   "parallelism'); use mxfp8, or pp = cp = 1")
    if (series == "0.2" and recipe == "mxfp8" and layout.tp > 1
            and "model" in compile_components(placed)):
        # components/quantization/mx.py L46-52 (0.2.2)
        out.append("refuses MXFP8 with tensor parallelism under torch.compile ('TP not yet "
                   "supported with torch.compile for mxfp8'); use tp=1 or no compile")
    return out


def stage_chunks(placed: Placed, version: str) -> list[list[str]] | None:
    """Module names of each model chunk when the plan's split is uneven; None when even.

    Chunk c runs on the rank torchtitan's schedule gives it (looped: c mod pp; V schedules:
    the V), as ``PipelineSplit.rank_of`` assumes.
    """
    split = pipeline_split(placed)
    if len(set(split.chunks)) == 1:
        return None
    chunks, start = [], 0
    for count in split.chunks:
        chunks.append([f"layers.{i}" for i in range(start, start + count)])
        start += count
    chunks[0].insert(0, "tok_embeddings")
    chunks[-1] += ["norm", _output_name(version)]
    return chunks


# placer's schedule -> torch.distributed.pipelining schedule name (get_schedule_class).
SCHEDULE_NAMES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe",
                  "zb1p": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble",
                  "dualpipev": "DualPipeV"}


def runs_as(layout: Layout) -> Layout:
    """``layout`` as torchtitan runs the config ``config`` writes for it: no ZeRO-1/2, so FSDP
    that keeps the parameters gathered after the forward (zero=3, reshard off); FSDP over cp
    whenever cp > 1 (ParallelDims.fsdp_enabled); selective as its op-level checkpointing
    (recompute=op); sequence parallelism with TP."""
    values = layout.model_dump()
    if layout.recompute == "selective":
        values["recompute"] = "op"
    values["sequence_parallel"] = layout.tp > 1
    if layout.zero_stage in (1, 2):
        values.update(zero_stage=3, reshard_after_forward=False)
    elif layout.zero_stage == 0 and layout.cp > 1:
        # data_parallel_shard_degree 1: FSDP over cp alone, dp replicates (HSDP)
        values.update(zero_stage=3, dp_shard=layout.cp if layout.dp > 1 else None)
    return Layout.model_validate(values)


def config(placed: Placed, version: str) -> dict[str, dict[str, object]]:
    """torchtitan sections and keys for ``version`` (docs/sources.md 7.2)."""
    layout, job = placed.layout, placed.plan.job
    if layout.zero_stage == 0:
        replicate, shard, reshard = layout.dp, 1, "default"
    else:
        # HSDP: shard within dp_shard (of dp x cp; torchtitan's fsdp mesh is dp_shard x cp),
        # replicate across the rest.
        replicate = layout.zero_replicas
        shard = layout.dp // replicate
        # torchtitan has no ZeRO-1/2; FSDP that keeps parameters gathered after forward
        # communicates like ZeRO-2 (no re-gather in backward).
        if layout.zero_stage < 3:
            reshard = "never"
        elif layout.reshard_after_forward is None:
            reshard = "default"
        else:
            reshard = "always" if layout.reshard_after_forward else "never"
    parallelism: dict[str, object] = {
        REPLICATE_KEY: replicate,
        SHARD_KEY: shard,
        "fsdp_reshard_after_forward": reshard,
        "tensor_parallel_degree": layout.tp,
        "pipeline_parallel_degree": layout.pp,
        "context_parallel_degree": layout.cp,
    }
    if version_key(version) >= version_key("0.2"):
        parallelism["expert_parallel_degree"] = layout.ep
        if placed.plan.model.moe is not None and not writes_python(version):
            parallelism["expert_tensor_parallel_degree"] = layout.etp
    training: dict[str, object] = {"global_batch_size": job.global_batch_size,
                                   "seq_len": job.seq_len}
    if layout.pp > 1:
        # One pipeline schedule runs all microbatches of the step: the local batch is the
        # per-DP-rank share of the global batch, split into microbatches of mbs.
        training["local_batch_size"] = job.global_batch_size // layout.dp
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch_size
        parallelism["pipeline_parallel_schedule"] = SCHEDULE_NAMES[layout.pipeline_schedule]
        parallelism.update(_stages(placed, version))
        if writes_python(version):
            # 0.3 captures CUDA graphs by default and refuses them with PP (trainer.py,
            # Trainer.Config._validate_cuda_graphs: "CUDA graphs do not support pipeline
            # parallelism yet").
            training["disable_cuda_graphs"] = True
    else:
        training["local_batch_size"] = layout.micro_batch_size
    # Megatron's selective (core attention) and torchtitan's per-op SAC are both written as
    # torchtitan's selective mode with the per-op option, the nearest it has.
    mode = "selective" if layout.recompute in ("selective", "op") else layout.recompute
    checkpoint: dict[str, object] = {"mode": mode}
    if mode == "selective":
        checkpoint["selective_ac_option"] = "op"
    sections: dict[str, dict[str, object]] = {
        "job": {"description": f"{job.name} ({layout})"},
        "training": dict(sorted(training.items())),
        "parallelism": parallelism,
        "activation_checkpoint": checkpoint,
    }
    if not writes_python(version):
        sections.update(_fp8_sections(placed, version))
    components = compile_components(placed)
    if components and version_key(version) < version_key("0.2"):
        # 0.1: --training.compile compiles each block and the loss (torchtitan@f7084fc
        # config_manager.py Training.compile, components/loss.py build_cross_entropy_loss).
        sections["training"] = dict(sorted({**training, "compile": True}.items()))
    elif components:
        # 0.2 and later: [compile] enable, components (config/job_config.py Compile, 0.3's
        # config/configs.py CompileConfig; torchtitan@08b8b244f moved it out of [training]).
        sections["compile"] = {"enable": True, "components": list(components)}
    return sections


def _fp8_sections(placed: Placed, version: str) -> dict[str, dict[str, object]]:
    """0.2's ``[model] converters`` and ``[quantize.*]`` options for the plan's FP8."""
    converters = fp8_converters(placed, version)
    if not converters:
        return {}
    recipe = fp8_recipe(placed, version)
    out: dict[str, dict[str, object]] = {"model": {"converters": converters}}
    kind = _converter_kind(str(recipe))
    if kind == "float8":
        linear: dict[str, object] = {"filter_fqns": [_output_name(version)]}
        if recipe == "rowwise":
            linear["recipe_name"] = recipe
        elif _fsdp_float8_all_gather(placed, version):
            linear.update(enable_fsdp_float8_all_gather=True,
                          precompute_float8_dynamic_scale_for_fsdp=True)
        out["quantize.linear.float8"] = linear
    if len(converters) > 1:
        out[f"quantize.grouped_mm.{kind}"] = {"fqns": [EXPERTS_FQN]}
    return out


def fp8_notes(placed: Placed, version: str) -> list[str]:
    """What the FP8 converters run that the estimate priced otherwise."""
    recipe = fp8_recipe(placed, version)
    if recipe is None:
        return []
    notes, runtime = [], placed.plan.job.runtime
    if runtime.fp8_recipe is None:
        notes.append(f"FP8: torchtitan's {recipe} scaling (the job sets no runtime fp8_recipe; "
                     "the estimate prices per-tensor-scaled FP8 GEMMs).")
    if runtime.fp8_param_gather and not _fsdp_float8_all_gather(placed, version):
        notes.append("The estimate keeps FP8 weights (fp8_param_gather), but torchtitan's FP8 "
                     "all-gather runs with FSDP and tensorwise scaling only (0.2's "
                     "enable_fsdp_float8_all_gather): not written, so the launch gathers bf16.")
    return notes


def compile_components(placed: Placed) -> tuple[str, ...]:
    """torchtitan's compile.components for what the cost model priced compiled (runtime.
    torch_compile on the job's stack, placer.cost.stack_options.job_options): ``model`` (each
    block) and ``loss``; none when the knob is off."""
    options = job_options(placed.plan.job)
    return tuple(name for name, on in (("model", options.compiled_layers),
                                       ("loss", options.compiled_loss)) if on)


def _stages(placed: Placed, version: str) -> dict[str, object]:
    """How the model is cut into pipeline chunks, in the form ``version`` accepts."""
    layout = placed.layout
    stages = placed.candidate.stage_layers
    chunks = stage_chunks(placed, version)
    if chunks is None:
        layers = stages[0] if stages else placed.plan.model.num_layers // layout.pp
        # torchtitan's default split counts the embedding and the output as a layer each
        # (Llama 3 8B on pp=4: 8, 9, 8, 7), so the even split is stated: embedding and output
        # count as no layers, and layers / per-stage = pp x vpp chunks.
        return {"pipeline_parallel_layers_per_stage": layers // layout.vpp,
                "pipeline_parallel_first_stage_less_layers": 0,
                "pipeline_parallel_last_stage_less_layers": 0}
    if version_key(version) < version_key("0.2"):
        # 0.1: each split point names the first layer module of the next chunk.
        return {"pipeline_parallel_split_points": [c[0] for c in chunks[1:]
                                                   if c[0].startswith("layers.")]}
    return {"module_fqns_per_model_part": chunks}


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def render_toml(placed: Placed, version: str, notes: list[str]) -> str:
    lines = [f"# {note}" if note else "#" for note in notes]
    for section, keys in config(placed, version).items():
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def _converter_lines(placed: Placed, version: str) -> list[str]:
    """0.3: the FP8 converters applied to the base config's model config, as model_registry
    applies its ``converters`` (``c.build().convert(config)``)."""
    classes = fp8_converters(placed, version)
    if not classes:
        return []
    recipe = fp8_recipe(placed, version)
    arguments = {"Float8LinearConverter": f"recipe_name={recipe!r}, filter_fqns=['lm_head'], ",
                 "MXFP8LinearConverter": "fqns=['layers'], "}
    lines = [f"    from torchtitan.components.quantization import {', '.join(classes)}",
             "",
             '    compiled = config.compile.enable and "model" in config.compile.components',
             "    for converter in ("]
    for name in classes:
        lines += [f"            {name}.Config(",
                  f"                {arguments.get(name, '')}model_compile_enabled=compiled),"]
    lines += ["    ):",
              "        model = config.model_spec.model",
              "        config.model_spec.model = converter.build().convert(model)"]
    return lines


def _py(value: object) -> str:
    """A Python literal (ints, strings, None, booleans and lists of them)."""
    return repr(value)


def render_python(placed: Placed, version: str, notes: list[str],
                  comments: tuple[str, ...] = ()) -> str:
    """A torchtitan 0.3 config module: ``placer_job()`` = a base config + placer's settings.

    ``comments`` become ``#`` lines after the docstring (machine-read markers).
    """
    sections = config(placed, version)
    base = BASE_CONFIGS.get(placed.plan.model.name)
    ac = sections["activation_checkpoint"]["mode"]
    ac_class = {"none": None, "selective": "SelectiveAC", "full": "FullAC"}[str(ac)]
    doc = [f'"""{notes[0]}' if notes else '"""', *notes[1:], '"""']
    lines = [
        *doc,
        *(f"# {c}" for c in comments),
        "",
        "import importlib",
        "import os",
        "",
        "# Model, data, optimizer and checkpointing come from this torchtitan config function",
        "# (module:function); PLACER_TORCHTITAN_BASE overrides it.",
        f"BASE = {_py(base)}",
        "",
        "",
        "def placer_job():",
        '    """The base config with the plan\'s parallelism, batch and recomputation."""',
        '    base = os.environ.get("PLACER_TORCHTITAN_BASE", BASE)',
        "    if not base:",
        "        raise SystemExit(\"torchtitan_config.py: set PLACER_TORCHTITAN_BASE to your \"",
        "                         \"model's torchtitan config function (module:function)\")",
        '    module, _, name = base.partition(":")',
        "    return apply(getattr(importlib.import_module(module), name)())",
        "",
        "",
        "def apply(config):",
        '    """Set the plan\'s settings on a torchtitan Trainer.Config and return it."""',
    ]
    if ac_class:
        lines.append(f"    from torchtitan.distributed.activation_checkpoint import {ac_class}")
        lines.append("")
    for section in ("parallelism", "training", "compile"):
        for key, value in sections.get(section, {}).items():
            lines.append(f"    config.{section}.{key} = {_py(value)}")
    lines += _converter_lines(placed, version)
    lines.append("    config.activation_checkpoint = "
                 + (f"{ac_class}.Config()" if ac_class else "None"))
    lines.append("    return config")
    return "\n".join(lines) + "\n"
