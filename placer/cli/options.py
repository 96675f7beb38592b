"""Flags shared by the commands that take a model, a cluster and a job, and their loading."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import click

from placer.errors import InputError
from placer.report.defaults import (
    NO_KNOBS,
    JobKnobs,
    job_warnings,
    resolve_gpu,
    resolve_job,
    resolve_nodes,
)
from placer.spec import Cluster, Job, Model
from placer.spec.job import OPTIMIZER_STATE_BYTES
from placer.spec.presets import cluster_names, load_cluster, load_model, preset_name

F = TypeVar("F", bound=Callable[..., Any])

_JOB_INPUT_OPTIONS = (
    click.option("--model", "model_ref", required=True, metavar="M",
                 help="model preset (see 'placer presets'), model YAML/JSON, or HF config.json"),
    click.option("--cluster", "cluster_ref", required=True, metavar="C",
                 help="cluster preset or cluster YAML/JSON file"),
    click.option("--nodes", type=click.IntRange(min=1), metavar="N",
                 help="scale a single-pool cluster to N nodes (default: its own size)"),
    click.option("--global-batch", type=click.IntRange(min=1), metavar="B",
                 help="sequences per step (default: the power of two nearest 4M tokens)"),
    click.option("--seq-len", type=click.IntRange(min=1), metavar="S",
                 help="tokens per sequence (default: the model's max, capped at 8192)"),
    click.option("--precision", type=click.Choice(["bf16", "fp8"]), default=None,
                 help="GEMM precision, FP8 keeps BF16 attention  [default: bf16]"),
)

_JOB_KNOB_OPTIONS = (
    click.option("--job", "job_file", type=click.Path(path_type=Path), metavar="FILE",
                 help="job YAML/JSON ('placer schema job'); the flags below override its fields"),
    click.option("--global-batch-tokens", type=click.IntRange(min=1), metavar="T",
                 help="tokens per step, instead of --global-batch (a multiple of --seq-len)"),
    click.option("--memory-headroom", "memory_headroom_gib", type=click.FloatRange(min=0.0),
                 metavar="GIB", help="GPU memory kept free beyond the predicted peak "
                                     "[default: 10 % of the GPU, 8 GB on 80 GB parts]"),
    click.option("--optimizer", type=click.Choice(sorted(OPTIMIZER_STATE_BYTES)),
                 help="optimizer, for its state bytes  [default: adam]"),
    click.option("--allow-tp-outside-nvlink/--no-allow-tp-outside-nvlink",
                 "allow_tp_outside_nvlink", default=None,
                 help="let TP groups span NVLink domains (slow)  [default: no]"),
    click.option("--stack", metavar="S",
                 help="training stack: preset (megatron-core@0.20, torchtitan@0.2, "
                      "deepspeed@0.19, nemo-automodel@0.5; a bare name takes the newest) or "
                      "stack file; only layouts it runs, with its defaults"),
    click.option("--overlap", "overlaps", metavar="LIST",
                 help="communication hidden behind compute: tp,dp_grad,param_gather,cp,ep,p2p "
                      "or none  [default: the stack's]"),
    click.option("--moe-imbalance", type=click.FloatRange(1.0, 64.0), metavar="F",
                 help="tokens the busiest expert rank gets, as a multiple of the mean "
                      "[default: the stack's, else 1.25]"),
    click.option("--torch-compile/--no-torch-compile", "torch_compile", default=None,
                 help="torch.compile what the stack compiles (torchtitan's --compile.enable: "
                      "each block and the loss)  [default: no]"),
    click.option("--gpu", metavar="GPU",
                 help="GPU preset for every node of the cluster, e.g. --cluster dgx-a100 --gpu "
                      "A100-40GB (see 'placer presets')"),
)
_KNOB_NAMES = tuple(f.name for f in fields(JobKnobs))


def knobs_from_params(params: dict[str, Any]) -> JobKnobs:
    """The job knobs among a command's parsed flags (click's ``ctx.params``)."""
    return JobKnobs(**{name: params[name] for name in _KNOB_NAMES})


def job_input_options(command: F) -> F:
    """Add the model, cluster and job flags; the job knobs reach ``command`` as ``job_knobs``."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        knobs = knobs_from_params(kwargs)
        for name in _KNOB_NAMES:
            del kwargs[name]
        return command(*args, job_knobs=knobs, **kwargs)

    decorated: Any = wrapper
    for option in reversed((*_JOB_INPUT_OPTIONS, *_JOB_KNOB_OPTIONS)):
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


@dataclass(frozen=True)
class JobInputs:
    """What the shared flags resolve to, and which defaults filled missing flags."""

    model: Model
    cluster: Cluster
    job: Job
    defaults_used: list[str]
    warnings: list[str] = field(default_factory=list)


def load_job_inputs(model_ref: str, cluster_ref: str, *, nodes: int | None,
                    global_batch: int | None, seq_len: int | None, precision: str | None,
                    constraints: Sequence[str] = (), knobs: JobKnobs = NO_KNOBS) -> JobInputs:
    """Load the model and cluster, scale the cluster, and fill the job's defaults.

    Implausible job values are reported on stderr as ``warning:`` lines (what was probably
    meant), and also kept in ``warnings``.
    """
    from placer.cost.profile import bounding_node_type, ceiling_notes

    model = load_model(model_ref)
    given = load_cluster(cluster_ref)
    cluster, gpu_used = resolve_gpu(given, knobs.gpu)
    is_preset = preset_name(cluster_ref, cluster_names()) is not None
    cluster, nodes_used = resolve_nodes(cluster, nodes, is_preset=is_preset)
    nodes_used = [*gpu_used, *nodes_used]
    capacity = bounding_node_type(cluster).gpu.capacity_bytes
    job, job_used = resolve_job(model, seq_len=seq_len, global_batch=global_batch,
                                constraints=tuple(constraints), precision=precision,
                                knobs=knobs, gpu_capacity_bytes=capacity)
    recipe = job.runtime.fp8_recipe
    for t in cluster.node_types:
        if (problem := t.gpu.fp8_recipe_problem(recipe)) is not None:
            raise InputError("runtime.fp8_recipe", recipe, problem)
    warnings = [*_gpu_swap_warnings(given, cluster), *job_warnings(job)]
    warnings += sorted({note for t in cluster.node_types
                        if (note := t.gpu.fp8_recipe_note(recipe)) is not None})
    warnings += sorted({note for t in cluster.node_types
                        if (note := t.gpu.precision_note(job.precision)) is not None})
    warnings += sorted({note for t in cluster.node_types
                        for note in ceiling_notes(t.gpu, job.precision)})
    for line in warnings:
        click.echo(f"warning: {line}", err=True)
    return JobInputs(model, cluster, job, [*nodes_used, *job_used], warnings)


def _gpu_swap_warnings(given: Cluster, swapped: Cluster) -> list[str]:
    """--gpu keeps the cluster's fabric and NICs; an AMD GPU put into an NVIDIA node (or the
    reverse) is then costed on links it does not have."""
    before = {t.gpu.collectives_library for t in given.node_types}
    return [f"--gpu {t.gpu.name}: {t.name}'s fabric and NICs are kept, but that node was built "
            f"for {'/'.join(sorted(before)).upper()} GPUs and {t.gpu.name} uses "
            f"{t.gpu.collectives_library.upper()}; describe the real node in a cluster file "
            "(placer init cluster) for a faithful estimate"
            for t in swapped.node_types if t.gpu.collectives_library not in before]


def load_profile_option(path: Path | None) -> Any:
    """The --profile file as a LinkProfile, or None."""
    if path is None:
        return None
    from placer.spec.profile import load_link_profile

    return load_link_profile(path)
