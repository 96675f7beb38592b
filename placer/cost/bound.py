"""A cheap lower bound on a layout's step time: its slowest stage's compute, nothing else.

The search (placer.solver.table) prices every degree tuple with one or two full estimates before
it can bound it; most tuples then turn out far slower than the best ones. This bound needs only
the per-layer work and its GEMM and kernel times (no group links, collectives, memory or
pipeline schedule), about a twentieth of an estimate, so a tuple whose bound already exceeds what
can still enter the result is dropped without being estimated.

Why it is a lower bound of ``estimate``: the step time is the sum of the breakdown's parts, each
>= 0, and ``compute_s`` is ``m`` times the forward + backward of the stage that is slowest in
total (compute and exposed communication); that stage's total is at least the largest compute
of any stage, which is what this returns (``estimate_with`` composes a stage's compute the same
way: its dense and MoE layers' pass times, plus the output layer on the last stage, plus an
offload stall >= 0 left out here). The search checks the bound against the estimates it then
makes and redoes the search without bounds if the cost model ever breaks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.cost.compute import (
    PassTimes,
    layer_work,
    linear_precision,
    logits_work,
    pass_times,
)
from placer.cost.options import CostOptions
from placer.cost.params import stage_shapes
from placer.cost.pipeline import bubble_s
from placer.cost.profile import calibration_for
from placer.cost.stack_options import job_options
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.profile import LinkProfile


@dataclass(frozen=True)
class ComputeFloor:
    """Parts of a layout's step that its compute alone fixes, each <= the estimate's part."""

    compute_s: float
    """Forward + backward of the slowest stage over the step's micro-batches, no recomputation:
    <= the breakdown's compute plus its TP, CP and EP exposure."""
    bubble_s: float
    """The schedule's bubble (placer.cost.pipeline.bubble_s) of the mean stage's compute alone:
    <= the breakdown's ``pp_bubble_s``, whose stages also carry their exposed communication
    (the bubble never shrinks as a stage's forward or backward grows)."""


def compute_floor(model: Model, cluster: Cluster, job: Job, layout: Layout,
                  profile: LinkProfile | None = None,
                  options: CostOptions | None = None) -> ComputeFloor:
    """The compute floor of ``layout`` at any placement (``estimate_with``'s composition of a
    stage's compute, its communication and offload stall left out)."""
    if options is None:
        options = job_options(job)
    calib = calibration_for(cluster, profile)
    precision = linear_precision(job, options)
    m = max(1, layout.num_microbatches(job.global_batch_size))
    dense = pass_times(layer_work(model, job, layout, False, options), calib, precision, "none")
    moe = (pass_times(layer_work(model, job, layout, True, options), calib, precision, "none")
           if model.moe is not None else None)
    head = pass_times(logits_work(model, job, layout), calib, "bf16", "none", is_layer=False)
    shapes = stage_shapes(model, layout)
    by_kind: dict[tuple[int, int, bool, bool], PassTimes] = {}
    for kind in sorted({shape.kind for shape in shapes}):
        layers, moe_layers, _, last = kind
        stage = dense.scaled(layers - moe_layers)
        if moe is not None:
            stage = stage + moe.scaled(moe_layers)
        by_kind[kind] = stage + head if last else stage
    slowest = max(t.forward_s + t.backward_s for t in by_kind.values())
    n = len(shapes)
    forward = sum(by_kind[s.kind].forward_s for s in shapes) / n
    backward = sum(by_kind[s.kind].backward_s for s in shapes) / n
    weight = sum(by_kind[s.kind].gemm_s for s in shapes) / 3 / n  # no recompute: 3 passes
    bubble = bubble_s(layout.pipeline_schedule, layout.pp, layout.vpp, forward, backward, weight)
    return ComputeFloor(compute_s=m * slowest, bubble_s=bubble)
