"""``placer estimate``: the cost model's verdict on one layout (step time, memory, breakdown).

Thin: load the model, cluster and optional link profile, fill the job defaults the way
``recommend-layout`` does, validate the layout, and print ``placer.cost.estimate``'s result as a
table or as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from placer.cli.options import (
    JobKnobs,
    job_input_options,
    load_job_inputs,
    load_profile_option,
)
from placer.cost import estimate
from placer.errors import InputError
from placer.mesh import parse_order
from placer.spec.layout import Layout, validate_layout
from placer.spec.pipeline import split_notes
from placer.spec.results import Estimate
from placer.units import GIB


@click.command("estimate")
@job_input_options
@click.option("--layout", "layout_text", required=True, metavar="SPEC",
              help="e.g. 'tp=8,pp=8,dp=16,mbs=1,zero=1,recompute=selective,sp=on'; a missing dp "
                   "takes the GPUs left over; degrees using fewer GPUs run on the first ones")
@click.option("--order", "order_text", default="tp-cp-dp-pp", show_default=True, metavar="ORDER",
              help="rank order, innermost first (Megatron spelling)")
@click.option("--profile", type=click.Path(path_type=Path), metavar="FILE",
              help="measured link profile (from 'placer calibrate') in place of preset constants")
@click.option("--json", "as_json", is_flag=True, help="print the estimate as JSON")
def estimate_command(model_ref: str, cluster_ref: str, nodes: int | None,
                     global_batch: int | None, seq_len: int | None, precision: str | None,
                     layout_text: str, order_text: str, profile: Path | None,
                     as_json: bool, job_knobs: JobKnobs) -> None:
    """Predict step time, throughput, memory and where the time goes for one layout."""
    inputs = load_job_inputs(model_ref, cluster_ref, nodes=nodes, global_batch=global_batch,
                             seq_len=seq_len, precision=precision, knobs=job_knobs)
    model, cluster, job = inputs.model, inputs.cluster, inputs.job
    defaults_used = inputs.defaults_used
    layout = Layout.parse(layout_text, num_gpus=cluster.num_gpus)
    if layout.num_gpus > cluster.num_gpus:
        raise InputError("--layout", layout_text, f"needs {layout.num_gpus} GPUs; the cluster "
                         f"has {cluster.num_gpus} (use --nodes or smaller degrees)")
    # Degrees that multiply to fewer GPUs than the cluster has run on its first slots.
    validate_layout(layout, model, job, layout.num_gpus)
    if layout.num_gpus < cluster.num_gpus:
        defaults_used.append(f"runs on the first {layout.num_gpus} of {cluster.num_gpus} GPUs")
    defaults_used.extend(split_notes(layout, model.num_layers))
    order = parse_order(order_text)
    result = estimate(model, cluster, job, layout, order=order,
                      profile=load_profile_option(profile))
    if cluster.mixed_node_types:  # MFU of the GPUs used (imports the solver)
        from placer.solver import used_peaks_estimate

        result = used_peaks_estimate(cluster, job, result)
    if as_json:
        from placer.spec.documents import EstimateDocument, document

        doc = document(EstimateDocument, {
            "model": model.name, "cluster": cluster.name, "num_gpus": layout.num_gpus,
            "seq_len": job.seq_len, "global_batch_size": job.global_batch_size,
            "precision": job.precision, "defaults_used": defaults_used,
            **result.model_dump(mode="json")})
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    _print(result, model.name, cluster.name, job.seq_len, job.global_batch_size,
           defaults_used)


def _print(est: Estimate, model: str, cluster: str, seq_len: int, batch: int,
           defaults: list[str]) -> None:
    console = Console(width=110)
    fits = "[green]fits[/]" if est.fits else "[red]does not fit[/]"
    console.print(f"[bold]{model}[/] on {cluster} ({est.layout.num_gpus:,} GPUs), "
                  f"{batch:,} x {seq_len:,} tokens per step: {est.layout.compact()} "
                  f"(order {'-'.join(est.mesh_order)})")
    console.print(f"step {est.step_time_s:.3f} s, {est.tokens_per_s:,.0f} tokens/s, "
                  f"{est.tflops_per_gpu:.0f} model TFLOP/s per GPU (MFU {est.mfu:.1%}, "
                  f"hardware {est.hardware_tflops_per_gpu:.0f}), "
                  f"peak memory {est.peak_memory_bytes / GIB:.1f} of "
                  f"{est.memory.capacity_bytes / GIB:.1f} GiB usable (after the job's memory "
                  f"headroom): {fits}")
    for line in defaults:
        console.print(f"[dim]default: {line}[/]")
    step = Table("where the time goes", "seconds", "share", title="step breakdown")
    for name, value in est.breakdown.model_dump().items():
        share = value / est.step_time_s if est.step_time_s else 0.0
        step.add_row(name.removesuffix("_s").replace("_", " "), f"{value:.4f}", f"{share:.1%}")
    memory = Table("memory (worst stage)", "GiB", title=f"memory, stage {est.memory.worst_stage}")
    for name, value in est.memory.model_dump().items():
        if name.endswith("_bytes"):
            memory.add_row(name.removesuffix("_bytes").replace("_", " "), f"{value / GIB:.2f}")
    comms = Table("dim", "collective", "group", "link", "algorithm", "message MB", "calls",
                  "busbw GB/s", "exposed s", title="collectives per step")
    for c in est.collectives:
        comms.add_row(c.dimension, c.collective, str(c.group_size), c.link_class, c.algorithm,
                      f"{c.message_bytes / 1e6:.1f}", str(c.calls_per_step),
                      f"{c.bus_bandwidth_bytes_per_s / 1e9:.0f}", f"{c.exposed_s:.4f}")
    for table in (step, memory, comms):
        console.print(table)


COMMANDS = [estimate_command]
