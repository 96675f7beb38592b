"""What would change the answer: the best layout again at half and twice the batch, twice the nodes.

Each variant searches only the degree tuples of the main search's costed table (for twice the
nodes, each with one of dp, pp, cp or tp doubled) instead of the whole space again: three more
full searches took 60-75 % of the command's time, most of it bounding tuples that cannot win.
Within those tuples every knob (micro-batch, virtual stages, ZeRO, recompute, SP) is searched,
placed and ranked by the same solver code with the same CP-SAT budget as the main search (a
smaller budget places worse and can fake a flip). Only when none of those tuples runs in the
variant is its whole space searched, so "no layout works" is never claimed of a variant that has
one. bench/search_speed.py compares the answers with full searches of each variant.
Which variants run depends only on the inputs (never on elapsed time), so the same inputs always
give the same explanation. Twice the nodes is tried on regular clusters only: doubling a cluster
with failed GPUs or several node pools is not a question anyone asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from placer.errors import PlacerError
from placer.report.forked import forked_map
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model

if TYPE_CHECKING:  # the solver (ortools) loads only when a search runs
    from placer.solver.space import Degrees

RecommendFn = Callable[..., Any]
MAX_GPUS_FOR_MORE_NODES = 4096
"""Twice the nodes is tried only up to this many GPUs after doubling, to keep the command fast."""
GROWN_DIMS = ("dp", "pp", "cp", "tp")
"""The degrees one of which a layout doubles to use twice the nodes."""



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


def tuples_for(tuples: Sequence[Degrees], cluster: Cluster, variant: Cluster) -> list[Degrees]:
    """The degree tuples a variant searches: the main search's as they are for another batch;
    with twice the nodes, each of them with one of dp, pp, cp or tp doubled."""
    if variant.num_gpus == cluster.num_gpus:
        return list(tuples)
    factor = variant.num_gpus // cluster.num_gpus
    if factor * cluster.num_gpus != variant.num_gpus:
        return []
    return [replace(d, **{dim: factor * getattr(d, dim)}) for d in tuples for dim in GROWN_DIMS]


def what_ifs(model: Model, cluster: Cluster, job: Job, recommend_fn: RecommendFn,
             tuples: Sequence[Degrees], profile: Any = None) -> Iterator[WhatIf]:
    """The best layout of each variant over the degree ``tuples`` of the main search's table
    (``tuples_for``), in the order of ``variants``. They are independent searches, so they start
    at once, in forked children where there is a second CPU and a second cluster to search
    (``forked.forked_map``), while the caller prints the main answer; each is yielded as soon as
    it is known. Only its layout and
    step time are read, so ``recommend_fn`` (``placer.solver.recommend``) writes no rank map."""

    def solve(variant: tuple[str, Cluster, Job]) -> WhatIf:
        label, variant_cluster, variant_job = variant
        among = tuples_for(tuples, cluster, variant_cluster)
        try:
            try:
                found = recommend_fn(model, variant_cluster, variant_job, top_k=1,
                                     profile=profile, among=among, rank_maps=False)
            except PlacerError:  # none of those tuples runs there: search the whole space
                found = recommend_fn(model, variant_cluster, variant_job, top_k=1,
                                     profile=profile, rank_maps=False)
        except PlacerError as exc:
            return WhatIf(label, None, None, str(exc))
        best = found.candidates[0]
        return WhatIf(label, best.layout, best.step_time_s)

    # One child per cluster: the batch variants share the main search's cluster (and in one
    # process its caches); twice the nodes has its own.
    return forked_map(solve, variants(cluster, job), group=lambda variant: id(variant[1]))
