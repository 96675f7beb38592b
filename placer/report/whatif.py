"""What would change the answer: the best layout again at half and twice the batch, twice the nodes.

Each variant is a fresh search of its own problem, the same ``recommend`` call (the same top-k,
bounds, CP-SAT budget and tie-breaks) a user's run of the command on the varied inputs makes, so
a what-if sentence never says what a search of that variant would contradict. A variant's best
layout need not be among the main table's rows: that table keeps only the degree tuples within
reach of the main top k, and another batch or cluster can make one outside that reach win
(Llama 3.1 405B on 16,384 H100: re-ranking only the main table's 73 rows printed "The answer
holds at twice the global batch" where a search of that batch finds TP=8 PP=8 CP=2 VPP=8).
The searches stay affordable because the table's exact bounds (placer.solver.table) skip what
cannot win, and they start right after the main search in forked children
(``forked.forked_map``).
Which variants run depends only on the inputs (never on elapsed time), so the same inputs always
give the same explanation. Twice the nodes is tried on regular clusters only: doubling a cluster
with failed GPUs or several node pools is not a question anyone asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from placer.errors import PlacerError
from placer.report.forked import forked_map
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


def what_ifs(model: Model, cluster: Cluster, job: Job, recommend_fn: RecommendFn, *,
             top_k: int, profile: Any = None) -> Iterator[WhatIf]:
    """The best layout of each variant, in the order of ``variants``: ``recommend_fn``
    (``placer.solver.recommend``) of the variant with the main search's ``top_k`` and
    ``profile``, so its #1 is the one a fresh run on the varied inputs prints. They are
    independent searches, so they start at once, in forked children where there is a second CPU
    and a second cluster to search (``forked.forked_map``), while the caller prints the main
    answer; each is yielded as soon as it is known. Only its layout and step time are read, so no
    rank map is written (``rank_maps=False``: it changes no candidate's layout or figures)."""

    def solve(variant: tuple[str, Cluster, Job]) -> WhatIf:
        label, variant_cluster, variant_job = variant
        try:
            found = recommend_fn(model, variant_cluster, variant_job, top_k=top_k,
                                 profile=profile, rank_maps=False)
        except PlacerError as exc:
            return WhatIf(label, None, None, str(exc))
        best = found.candidates[0]
        return WhatIf(label, best.layout, best.step_time_s)

    # One child per cluster: the batch variants share the main search's cluster (and in one
    # process its caches); twice the nodes has its own.
    return forked_map(solve, variants(cluster, job), group=lambda variant: id(variant[1]))
