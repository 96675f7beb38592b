"""``placer presets`` and ``placer schema``: what placer knows and what its files look like."""

from __future__ import annotations

import json

import click
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from placer.spec.presets import (
    cluster_names,
    cluster_preset,
    gpu_names,
    gpu_preset,
    model_names,
    model_preset,
)
from placer.units import gib

SCHEMA_NAMES = ("model", "cluster", "node", "job", "layout", "profile", "plan", "estimate",
                "rankmap", "replay", "bench-config", "bench", "verify", "check", "stack",
                "real-model", "verify-real-model")
"""Every document placer reads or writes, by the name ``placer schema NAME`` takes: model,
cluster, node (``topology import``), job, layout, profile (``calibrate --out``), plan
(``recommend-layout --json/--emit``), estimate (``estimate --json``), rankmap (``launch``:
rankmap.json), replay (verify's replay.json), bench-config and bench (the calibration worker's
config and measurements), verify (``verify --json/--out``), check (``check --format json``),
stack (``--stack FILE``), real-model (``verify --real-model``'s model.json) and
verify-real-model (its ``--json/--out`` results)."""


def schemas() -> dict[str, type[BaseModel]]:
    """The model of every name in SCHEMA_NAMES (imported only when asked for)."""
    from placer.check.findings import CheckReport
    from placer.spec import Cluster, Job, Layout, Model, Plan
    from placer.spec.cluster import NodeType
    from placer.spec.documents import (
        BenchConfig,
        BenchResults,
        EstimateDocument,
        RankMapDocument,
        RealModelConfig,
        RealModelResults,
        ReplayConfig,
        VerifyResults,
    )
    from placer.spec.profile import LinkProfile
    from placer.spec.stack import Stack

    models: list[type[BaseModel]] = [Model, Cluster, NodeType, Job, Layout, LinkProfile, Plan,
                                     EstimateDocument, RankMapDocument, ReplayConfig, BenchConfig,
                                     BenchResults, VerifyResults, CheckReport, Stack,
                                     RealModelConfig, RealModelResults]
    return dict(zip(SCHEMA_NAMES, models, strict=True))


@click.command("presets")
@click.option("--json", "as_json", is_flag=True, help="machine-readable list")
def presets_command(as_json: bool) -> None:
    """List every GPU, cluster, model and stack preset."""
    from placer.spec.stack import load_stack, stack_names

    if as_json:
        click.echo(json.dumps({"gpus": gpu_names(), "clusters": cluster_names(),
                               "models": model_names(), "stacks": stack_names()}, indent=2))
        return
    console = Console(width=120)
    gpus = Table("GPU", "memory GiB", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "collectives",
                 title="GPUs (dense peaks)")
    for name in gpu_names():
        g = gpu_preset(name)
        fp8 = f"{g.fp8_flops / 1e12:.0f}" if g.fp8_flops else "-"
        half = f"{g.bf16_flops / 1e12:.0f}"
        if g.half_precision_dtype != "bf16":
            half += f" ({g.half_precision_dtype.upper()})"
        gpus.add_row(name, gib(g.capacity_bytes), half, fp8,
                     f"{g.hbm_bandwidth_bytes_per_s / 1e12:.2f}", g.collectives_library.upper())
    clusters = Table("cluster", "GPU", "GPUs/node", "NVLink domain", "NICs/node", "description",
                     title="clusters (scale with --nodes)")
    for name in cluster_names():
        c = cluster_preset(name)
        t = c.node_types[0]
        nics = f"{len(t.nics)}x{t.nics[0].rate_gbps:g}Gb/s" if t.nics else "-"
        clusters.add_row(name, t.gpu.name, str(t.gpus_per_node), str(t.nvlink_domain_size), nics,
                         c.description)
    models = Table("model", "layers", "hidden", "heads/kv", "FFN", "vocab", "experts",
                   title="models")
    for name in model_names():
        m = model_preset(name)
        experts = f"{m.moe.num_experts} top-{m.moe.top_k}" if m.moe else "-"
        models.add_row(name, str(m.num_layers), str(m.hidden_size),
                       f"{m.num_attention_heads}/{m.kv_heads}", str(m.ffn_hidden_size),
                       str(m.vocab_size), experts)
    stacks = Table("stack", "framework", "schedules", "recompute", "ZeRO", "source",
                   title="stacks (--stack)")
    for name in stack_names():
        k = load_stack(name)
        stacks.add_row(name, k.framework, " ".join(k.schedules), " ".join(k.recompute),
                       " ".join(map(str, k.zero_stages)), k.source)
    for table in (gpus, clusters, models, stacks):
        console.print(table)


@click.command("schema")
@click.argument("kind", type=click.Choice(sorted(SCHEMA_NAMES)))
def schema_command(kind: str) -> None:
    """Print the JSON Schema of a file placer reads or writes (see SCHEMA_NAMES)."""
    click.echo(json.dumps(schemas()[kind].model_json_schema(), indent=2, sort_keys=True))


COMMANDS = [presets_command, schema_command]
