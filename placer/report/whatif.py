"""What would change the answer: the best layout again at half and twice the batch, twice the nodes.

Each variant is a fresh search of its own problem, the same ``recommend`` call (the same top-k,
bounds, CP-SAT budget and tie-breaks) a user's run of the command on the varied inputs makes, so
a what-if sentence never says what a search of that variant would contradict. A variant's best
layout need not be among the main table's rows: that table keeps only the degree tuples within
reach of the main top k, and another batch or cluster can make one outside that reach win
(Llama 3.1 405B on 16,384 H100: re-ranking only the main table's 73 rows printed "The answer
holds at twice the global batch" where a search of that batch finds TP=8 PP=8 CP=2 VPP=8).
The searches stay affordable because the table's exact bounds (placer.solver.table) skip what
cannot win, and they run in forked children (``forked.ForkedRuns``), one each, as soon as the
main search ends, when they can reuse its costed pieces (placer.cost.memo), beside the main
answer's output; with more than two CPUs, the variants that share least with the main search
(twice the nodes first) start before it, on the CPUs it leaves free (``SHARED_CPUS``).
Which variants run depends only on the inputs (never on elapsed time), so the same inputs always
give the same explanation. Twice the nodes is tried on regular clusters only: doubling a cluster
with failed GPUs or several node pools is not a question anyone asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from placer.errors import PlacerError
from placer.report.forked import ForkedRuns, usable_cpus
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model

RecommendFn = Callable[..., Any]
Variant = tuple[str, Cluster, Job]
"""A what-if's label and its varied cluster and job."""
MAX_GPUS_FOR_MORE_NODES = 4096
"""Twice the nodes is tried only up to this many GPUs after doubling, to keep the command fast."""
SHARED_CPUS = 2
"""CPUs the main search and the children started after it share: only the CPUs beyond them start
what-ifs beside the main search. On the 2-CPU development machine (a VM) two busy processes
got 1.33x one process's throughput when it was quiet and none under load, so a what-if started
early took CPU from the main search: same tree, 3 runs at load 4, the command's wall time was
the same or longer than starting every what-if after it (GPT-3 6.64 vs 6.27 s, 405B 7.14 vs 7.39,
DeepSeek-V3 21.1 vs 20.8, 100k 4.41 vs 3.64), its answer later (4.3 vs 2.8 s on GPT-3), and its
CPU larger (a cold what-if reuses none of the main search's costed pieces;
bench/results/search_speed-2026-12-02.md)."""


@dataclass(frozen=True)
class WhatIf:
    """One variant of the inputs and the best layout for it (or why none)."""

    label: str
    layout: Layout | None
    step_time_s: float | None
    problem: str = ""


def variants(cluster: Cluster, job: Job) -> list[Variant]:
    """The variants worth a solver run, in the order the explanation lists them."""
    out: list[Variant] = []
    gb = job.global_batch_size
    batches = [("twice", 2 * gb)] + ([("half", gb // 2)] if gb % 2 == 0 else [])
    for word, batch in batches:
        variant = _with_batch(job, batch)
        if variant is not None:
            out.append((f"{word} the global batch ({batch:,} sequences)", cluster, variant))
    if cluster.is_regular and 2 * cluster.num_gpus <= MAX_GPUS_FOR_MORE_NODES:
        bigger = cluster.with_nodes(2 * cluster.num_nodes)
        out.append((f"twice the nodes ({bigger.num_nodes:,} nodes, {bigger.num_gpus:,} GPUs)",
                    bigger, job))
    return out


def _with_batch(job: Job, global_batch: int) -> Job | None:
    """The job with another global batch; None where that batch is outside a job's range."""
    try:
        return Job.model_validate({**job.model_dump(), "global_batch_size": global_batch})
    except ValidationError:
        return None


def start_what_ifs(model: Model, cluster: Cluster, job: Job, recommend_fn: RecommendFn, *,
                   top_k: int, profile: Any = None) -> ForkedRuns[Variant, WhatIf]:
    """The what-ifs, started before the main search: ``ForkedRuns.results`` then gives the best
    layout of each variant in the order of ``variants``. Each is ``recommend_fn``
    (``placer.solver.recommend``) of the variant with the main search's ``top_k`` and
    ``profile``, so its #1 is the one a fresh run on the varied inputs prints; only its layout
    and step time are read, so no rank map is written (``rank_maps=False``: it changes no
    candidate's layout or figures).

    They are independent searches. With ``n`` usable CPUs, ``n - SHARED_CPUS`` of them start
    now in forked children, beside the main search: first those on another cluster (twice the
    nodes), whose layouts have a new data-parallel degree and so reuse little of what the main
    search costs, then the others in order. The rest start when ``results`` is called (after the
    main search, whose cached micro-batches and memory the batch variants reuse), one child
    each, while the caller prints the main answer. On one CPU they are solved here, one by one,
    as read."""

    def solve(variant: Variant) -> WhatIf:
        label, variant_cluster, variant_job = variant
        try:
            found = recommend_fn(model, variant_cluster, variant_job, top_k=top_k,
                                 profile=profile, rank_maps=False)
        except PlacerError as exc:
            return WhatIf(label, None, None, str(exc))
        best = found.candidates[0]
        return WhatIf(label, best.layout, best.step_time_s)

    found = variants(cluster, job)
    runs = ForkedRuns(solve, found)
    runs.start(early_variants(found, cluster, usable_cpus() - SHARED_CPUS))
    return runs


def early_variants(found: list[Variant], cluster: Cluster, cores: int) -> list[int]:
    """Which of ``found`` to start beside the main search on ``cores`` free cores: those on
    another cluster first (they share least with the main search), then in order."""
    order = sorted(range(len(found)), key=lambda index: (found[index][1] is cluster, index))
    return order[:max(0, cores)]
