"""What would change the answer: the best layout again at half and twice the batch, twice the nodes.

Each variant is one solver run for the top 1, with the same budget as the main search (a smaller
CP-SAT budget places worse and can fake a flip). Which variants run depends only on the inputs
(never on elapsed time), so the same inputs always give the same explanation. Twice the nodes is
tried on regular clusters only: doubling a cluster with failed GPUs or several node pools is not
a question anyone asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from placer.errors import PlacerError
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model

RecommendFn = Callable[..., Any]
MAX_GPUS_FOR_MORE_NODES = 4096
"""Twice the nodes is tried only up to this many GPUs after doubling, to keep the command fast."""



@dataclass(frozen=True)
class WhatIf:
    """One variant of the inputs and the best layout for it (or why none)."""

    label: str
    layout: Layout | None
    step_time_s: float | None
    problem: str = ""


def variants(cluster: Cluster, job: Job) -> list[tuple[str, Cluster, Job]]:
    """The variants worth a solver run, in the order the explanation lists them."""
    out: list[tuple[str, Cluster, Job]] = []
    gb = job.global_batch_size
    batches = [("twice", 2 * gb)] + ([("half", gb // 2)] if gb % 2 == 0 else [])
    for word, batch in batches:
        variant = _with_batch(job, batch)
        if variant is not None:
            out.append((f"{word} the global batch ({batch} sequences)", cluster, variant))
    if cluster.is_regular and 2 * cluster.num_gpus <= MAX_GPUS_FOR_MORE_NODES:
        bigger = cluster.with_nodes(2 * cluster.num_nodes)
        out.append((f"twice the nodes ({bigger.num_nodes} nodes, {bigger.num_gpus} GPUs)", bigger,
                    job))
    return out


def _with_batch(job: Job, global_batch: int) -> Job | None:
    """The job with another global batch; None where that batch is outside a job's range."""
    try:
        return Job.model_validate({**job.model_dump(), "global_batch_size": global_batch})
    except ValidationError:
        return None


def what_ifs(model: Model, cluster: Cluster, job: Job, recommend_fn: RecommendFn,
             profile: Any = None) -> list[WhatIf]:
    """Solve each variant for its single best layout."""
    results = []
    for label, variant_cluster, variant_job in variants(cluster, job):
        try:
            found = recommend_fn(model, variant_cluster, variant_job, top_k=1, profile=profile)
        except PlacerError as exc:
            results.append(WhatIf(label, None, None, str(exc)))
            continue
        best = found.candidates[0]
        results.append(WhatIf(label, best.layout, best.step_time_s))
    return results
