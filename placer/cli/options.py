"""Flags shared by the commands that take a model, a cluster and a job, and their loading."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from placer.report.defaults import resolve_job, resolve_nodes
from placer.spec import Cluster, Job, Model
from placer.spec.presets import cluster_names, load_cluster, load_model

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
    click.option("--precision", type=click.Choice(["bf16", "fp8"]), default="bf16",
                 show_default=True, help="GEMM precision (FP8 keeps BF16 attention)"),
)


def job_input_options(command: F) -> F:
    """Add --model, --cluster, --nodes, --global-batch, --seq-len and --precision."""
    for option in reversed(_JOB_INPUT_OPTIONS):
        command = option(command)
    return command


@dataclass(frozen=True)
class JobInputs:
    """What the shared flags resolve to, and which defaults filled missing flags."""

    model: Model
    cluster: Cluster
    job: Job
    defaults_used: list[str]


def load_job_inputs(model_ref: str, cluster_ref: str, *, nodes: int | None,
                    global_batch: int | None, seq_len: int | None, precision: str,
                    constraints: Sequence[str] = ()) -> JobInputs:
    """Load the model and cluster, scale the cluster, and fill the job's defaults."""
    model = load_model(model_ref)
    cluster = load_cluster(cluster_ref)
    cluster, nodes_used = resolve_nodes(cluster, nodes, is_preset=cluster_ref in cluster_names())
    job, job_used = resolve_job(model, seq_len=seq_len, global_batch=global_batch,
                                constraints=tuple(constraints), precision=precision)
    return JobInputs(model, cluster, job, [*nodes_used, *job_used])


def load_profile_option(path: Path | None) -> Any:
    """The --profile file as a LinkProfile, or None."""
    if path is None:
        return None
    from placer.spec.profile import load_link_profile

    return load_link_profile(path)
