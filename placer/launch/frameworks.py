"""Framework config files from one placement, in the dialects of ``placer.dialects``.

The dialect modules own the names and each version's rules; this module renders them as files
(a bash array for Megatron-LM, TOML and a Python module for torchtitan, JSON for DeepSpeed) with
the notes a person needs, and says which files a version refuses and why.
"""

from __future__ import annotations

from placer.dialects import Refusal, deepspeed, megatron, megatron_bridge, torchtitan
from placer.io import OutputFile
from placer.launch.priced import StackPrice, off_stack_price
from placer.launch.rankmap import PlacedCandidate
from placer.launch.shell import comment_block, quote


def world_line(placement: PlacedCandidate) -> list[str]:
    """``placer-world: nodes=N gpus_per_node=G`` when every node runs G ranks: the world size
    the file was made for, which ``placer check`` reads (placer/check/world.py)."""
    per_node = {node.num_ranks for node in placement.nodes}
    if len(per_node) != 1:
        return []
    return [f"placer-world: nodes={len(placement.nodes)} gpus_per_node={per_node.pop()}"]


def _priced(price: StackPrice | None) -> list[str]:
    return [] if price is None else price.lines()


def render_megatron_sh(placement: PlacedCandidate, version: str = megatron.TARGET.default,
                       price: StackPrice | None = None) -> str:
    """A bash array of Megatron flags to source and splice into the training command;
    ``price``: its layout on Megatron's stack when the plan was searched on another."""
    fit = megatron.fit(placement)
    layout = placement.layout
    notes = [
        f"Megatron-LM arguments for job {placement.plan.job.name}, layout {layout}, for "
        f"Megatron-LM core_v{version}.x (flag names: Megatron-LM arguments.py, docs/sources.md "
        "6.2; --framework-version megatron=X picks another release). Use them with launch.sh:",
        "    source megatron_args.sh",
        "    PLACER_SCRIPT=pretrain_gpt.py ./launch.sh \"${MEGATRON_ARGS[@]}\" <model and data "
        "arguments>",
        f"Rank order: {fit.explanation}",
    ]
    uneven = megatron.uneven_note(placement)
    if uneven:
        notes.append(uneven)
    if placement.plan.model.mla is not None:
        notes.append("The model's multi-head latent attention (--multi-latent-attention and its "
                     "shapes) is written here, as the plan priced it; Megatron-LM refuses "
                     "--group-query-attention with it.")
    if placement.plan.model.moe is not None and placement.plan.model.linear_bias:
        notes.append(f"{placement.plan.model.name}'s linears carry biases: with grouped-GEMM "
                     "experts (TEGroupedMLP) Megatron needs --no-bias-dropout-fusion among the "
                     "model arguments (moe/experts.py core_v0.16.1 L529-531: 'bias_dropout_fusion "
                     "is not supported in TEGroupedMLP when add_bias_linear=True').")
    if layout.zero_stage == 1:
        notes.append("zero=1: Megatron's distributed optimizer shards the optimizer state over "
                     "DP x CP and reduce-scatters gradients once per step.")
    if layout.zero_stage >= 2:
        what = "gradients and optimizer state" if layout.zero_stage == 2 else "everything"
        notes.append(f"zero={layout.zero_stage}: Megatron-FSDP "
                     f"({megatron.FSDP_STRATEGY[layout.zero_stage]}) shards {what} and "
                     "reduce-scatters gradients every micro-batch; it saves and loads only "
                     f"--ckpt-format {megatron.FSDP_CKPT_FORMAT}, and needs "
                     "CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (env.sh leaves it unset).")
    runtime, runtime_notes = megatron.runtime_settings(placement)
    notes += runtime_notes + _priced(price)
    lines = ["# shellcheck shell=bash", *comment_block(notes),
             *(f"# {line}" for line in world_line(placement)),
             "# shellcheck disable=SC2034  # read by the script that sources this file",
             "MEGATRON_ARGS=("]
    lines += ["  " + " ".join(quote(part) for part in arg)
              for arg in megatron.args(placement, runtime)]
    lines.append(")")
    return "\n".join(lines) + "\n"


def render_bridge_yaml(placement: PlacedCandidate,
                       version: str = megatron_bridge.TARGET.default,
                       price: StackPrice | None = None) -> str:
    """Megatron-Bridge overrides, merged into a recipe's ConfigContainer."""
    notes = [
        f"Megatron-Bridge {version}.x overrides for job {placement.plan.job.name}, layout "
        f"{placement.layout}: merge them into a recipe's ConfigContainer (a recipe script's "
        "--config-file, or OmegaConf.merge); the recipe supplies the model and data.",
        f"Rank order: {megatron.fit(placement).explanation}",
        *world_line(placement),
    ]
    uneven = megatron.uneven_note(placement)
    if uneven:
        notes.append(uneven)
    runtime, runtime_notes = megatron.runtime_settings(placement)
    doc = megatron_bridge.overrides(placement, runtime)
    recipe = doc["mixed_precision"]
    notes += runtime_notes + megatron_bridge.recipe_notes(
        runtime, recipe if isinstance(recipe, str) else None) + _priced(price)
    return megatron_bridge.render_yaml(doc, [
        line.removeprefix("# ").removeprefix("#") for line in comment_block(notes)])


def _torchtitan_notes(placement: PlacedCandidate, version: str, python: bool,
                      price: StackPrice | None = None) -> list[str]:
    layout = placement.layout
    fit = torchtitan.fit(placement)
    if python:
        run = [f"torchtitan {version}.x config for job {placement.plan.job.name}, layout "
               f"{layout}. Run it from the launch directory (launch.sh puts it on PYTHONPATH):",
               "    PLACER_SCRIPT=-m ./launch.sh torchtitan.train --module torchtitan_config "
               "--config placer_job",
               "The model comes from BASE below, a torchtitan config function."]
    else:
        run = [f"torchtitan settings for job {placement.plan.job.name}, layout {layout}, for "
               f"torchtitan {version}.x (TOML configs; torchtitan_config.py is the Python "
               "config of 0.3 and newer). Merge these sections into your model's train config."]
    notes = [*run, f"Rank order: {fit.explanation}"]
    if not python:
        notes += world_line(placement)
    if layout.zero_stage in (1, 2):
        notes.append(f"zero={layout.zero_stage}: torchtitan has no ZeRO-1/2; FSDP with "
                     "fsdp_reshard_after_forward = \"never\" is the closest (ZeRO-2 traffic).")
    stages = placement.candidate.stage_layers
    if stages is not None and len(set(stages)) > 1:
        notes.append(f"Uneven pipeline split {stages}: module names assume torchtitan's "
                     "decoder (tok_embeddings, layers.<i>, norm, output head).")
    if layout.tp > 1 and not layout.sequence_parallel:
        notes.append("The plan has sequence parallelism off, but torchtitan applies it with TP.")
    notes += torchtitan.fp8_notes(placement, version)
    return notes + _priced(price)


def render_torchtitan_toml(placement: PlacedCandidate, version: str = torchtitan.LAST_TOML,
                           price: StackPrice | None = None) -> str:
    notes = comment_block(_torchtitan_notes(placement, version, python=False, price=price))
    return torchtitan.render_toml(placement, version,
                                  [line.removeprefix("# ").removeprefix("#") for line in notes])


def render_torchtitan_py(placement: PlacedCandidate,
                         version: str = torchtitan.TARGET.default,
                         price: StackPrice | None = None) -> str:
    notes = comment_block(_torchtitan_notes(placement, version, python=True, price=price))
    return torchtitan.render_python(placement, version,
                                    [line.removeprefix("# ").removeprefix("#") for line in notes],
                                    tuple(world_line(placement)))


def framework_files(placement: PlacedCandidate, versions: dict[str, str]
                    ) -> tuple[list[OutputFile], list[Refusal], list[StackPrice]]:
    """The framework files the chosen versions accept, the ones they refuse (with why), and
    the written files' layouts priced on their own framework's stack where the plan was
    searched on another's (``priced.off_stack_price``; deepspeed.json, JSON without comments,
    has its note in the README only)."""
    files: list[OutputFile] = []
    refused: list[Refusal] = []
    prices: list[StackPrice] = []

    def price(file: str, version: str) -> StackPrice | None:
        found = off_stack_price(placement, file, version)
        if found is not None:
            prices.append(found)
        return found

    mv = versions["megatron"]
    no = megatron.refusals(placement, mv)
    refused += no
    if not no:
        files.append(OutputFile(megatron.FILE, render_megatron_sh(
            placement, mv, price(megatron.FILE, mv))))
    bv = versions["megatron-bridge"]
    no = megatron_bridge.refusals(placement, bv)
    refused += no
    if not no:
        files.append(OutputFile(megatron_bridge.FILE, render_bridge_yaml(
            placement, bv, price(megatron_bridge.FILE, bv))))
    tv = versions["torchtitan"]
    toml_version = torchtitan.toml_series(tv)
    no = torchtitan.refusals(placement, toml_version, torchtitan.TOML_FILE)
    refused += no
    if not no:
        files.append(OutputFile(torchtitan.TOML_FILE, render_torchtitan_toml(
            placement, toml_version, price(torchtitan.TOML_FILE, toml_version))))
    if torchtitan.writes_python(tv):
        no = torchtitan.refusals(placement, tv, torchtitan.PY_FILE)
        refused += no
        if not no:
            files.append(OutputFile(torchtitan.PY_FILE, render_torchtitan_py(
                placement, tv, price(torchtitan.PY_FILE, tv))))
    dv = versions["deepspeed"]
    no = deepspeed.refusals(placement, dv)
    refused += no
    if not no:
        price(deepspeed.FILE, dv)
        files.append(OutputFile(deepspeed.FILE, deepspeed.render_json(placement)))
    return files, refused, prices
