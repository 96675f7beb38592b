"""``recommend``: the degree space, the costed table, the top K rows, then placement.

1. Degree tuples (space.py) under the NVLink rule and the job's constraints; on irregular
   clusters the tuples may use fewer GPUs than are healthy.
2. The costed table (table.py): branch and bound with the cost model, natural placement.
3. The selection (select.py) picks the best distinct rows under the job's constraints, a few
   more than asked (an exact scan of the rows: each row's checks are constants of the row).
4. Placement (placement.py) for each pick: mesh orders and node tilings on regular clusters,
   the reduced CP-SAT model on irregular ones; the full cost model ranks every placement, and the
   picks are re-ranked by their best placement before the top K are kept.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from placer.cost import estimate, minimum_gpus_needed
from placer.cost.groups import representative_groups, worst_placed_groups
from placer.cost.profile import slowest_node_type
from placer.errors import InfeasibleError
from placer.mesh import order_text
from placer.solver.placement import (
    Placement,
    irregular_placements,
    order_placements,
    rank_map,
    tiling_placements,
    tp_capacity,
    traffic_weights,
)
from placer.solver.prefer import noted, prefer_validated
from placer.solver.reasons import memory_reason, no_degrees_reason
from placer.solver.select import select_top
from placer.solver.space import Degrees, degree_tuples, divisors, layout_key
from placer.solver.stages import split_for_types, used_peak_flops
from placer.solver.table import CostMemo, Row, TableStats, build_table
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, pipeline_stage_layers
from placer.spec.model import Model
from placer.spec.profile import LinkProfile
from placer.spec.results import Candidate, Estimate, SearchStats
from placer.topology import ClusterTopology, topology_of

DEFAULT_TIME_LIMIT_S = 10.0
"""CP-SAT budget per recommend call (deterministic seconds): half of it is the placements'
(irregular clusters' segment models; a mixed cluster's stage split has its own), shared by the
picks; the measured models finish far below it (bench/search_speed.py)."""

EXTRA_PICKS = 3
"""Picks beyond top K that also get a placement search, since a better placement can move one
into the top K. The table is exact for the top K; the extras are the best rows it holds."""

SEARCHED_K_AT_LEAST = 5
"""The fewest rows the table keeps exact and the selection picks for, whatever ``top_k`` asks:
on an irregular cluster the picks are re-priced after placement (worst groups, a mixed cluster's
uneven split by GPU type), which reorders them, so searching fewer would make ``--top 1``'s #1 a
worse layout than ``--top 5``'s (examples/mixed-a100-h100 at batch 1,024: 37 % slower). It is
the command's default ``--top`` (cli.recommend_command.DEFAULT_TOP_K): any ``top_k`` up to it
returns the first ``top_k`` of that search."""


@dataclass(frozen=True)
class SearchDetail:
    """How the search went, for benchmarks and explanations (not part of the plan file)."""

    degree_tuples: int
    layouts: int
    memory_checks: int
    estimates: int
    pairs: int
    pairs_expanded: int
    table_rows: int
    selection_status: str
    selection_solves: int
    placements_costed: int
    gpus_used: int
    bound_violations: int
    """Bounds the cost model broke (then the table was rebuilt without bounds); 0 expected."""
    placement_notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecommendResult:
    """Ranked candidates (best first), the plan's search stats, and the search detail."""

    candidates: list[Candidate]
    stats: SearchStats
    detail: SearchDetail


def _nvlink_size(cluster: Cluster) -> int:
    used = {p.node_type for p in cluster.pools}
    return min(t.nvlink_domain_size for t in cluster.node_types if t.name in used)


def _placements(row: Row, topology: ClusterTopology, cluster: Cluster, job: Job,
                time_limit_s: float) -> list[Placement]:
    # A regular cluster used whole, or on whole nodes: its first nodes are as good as any, and
    # the mesh orders and node tilings cover them (the segment search is for uneven nodes).
    if cluster.is_regular and row.layout.num_gpus % (cluster.num_gpus // cluster.num_nodes) == 0:
        return (order_placements(row.layout, topology, job)
                + tiling_placements(row.layout, topology, job))
    weights = traffic_weights(row.estimate.collectives)
    return irregular_placements(row.layout, topology, job, weights, time_limit_s=time_limit_s)


@dataclass(frozen=True)
class _Placed:
    """A pick with its best placement, before the rank map is written out."""

    estimate: Estimate
    placement: Placement
    costed: int
    why: list[str]
    stage_layers: list[int] | None = None
    """The uneven split by GPU speed (mixed GPU types), already priced into ``estimate``."""
    stage_notes: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[float, tuple[int, ...]]:
        return (self.estimate.step_time_s, layout_key(self.estimate.layout))

    @property
    def layout(self) -> Layout:
        return self.estimate.layout

    @property
    def step_time_s(self) -> float:
        return self.estimate.step_time_s

    @property
    def mesh_order(self) -> Sequence[str]:
        return self.placement.order


def _best_placement(model: Model, cluster: Cluster, job: Job, row: Row,
                    topology: ClusterTopology, profile: LinkProfile | None,
                    time_limit_s: float) -> _Placed | None:
    """The placement the full cost model likes best (ties: the earlier, i.e. more standard)."""
    best: tuple[float, int, Estimate, Placement] | None = None
    placements = _placements(row, topology, cluster, job, time_limit_s)
    for index, placement in enumerate(placements):
        est = estimate(model, cluster, job, row.layout, order=placement.order,
                       placement=placement.slots, profile=profile)
        if best is None or (est.step_time_s, index) < (best[0], best[1]):
            best = (est.step_time_s, index, est, placement)
    if best is None:
        return None
    _, _, est, placement = best
    why = [f"placement: {placement.label}; {len(placements)} placement(s) costed"]
    natural = row.step_time_s
    if est.step_time_s < natural:
        gain = (natural - est.step_time_s) / natural
        why.append(f"placement: {gain:.1%} faster than the natural order "
                   f"{order_text(row.estimate.mesh_order)}")
    return _Placed(est, placement, len(placements), why)


def _priced_on_worst_groups(placed: _Placed, model: Model, cluster: Cluster, job: Job,
                            profile: LinkProfile | None) -> _Placed:
    """Around failed GPUs the groups of a dimension need not sit alike, and the placements were
    costed on the group holding index 0: price each pick on its worst-placed groups instead
    (O(GPUs) per dimension, so only for the picks)."""
    est, placement = placed.estimate, placed.placement
    if placement.slots is None:
        return placed
    order = tuple(placement.order)
    experts = model.moe is not None
    worst = worst_placed_groups(cluster, est.layout, order, placement.slots, experts)
    first = representative_groups(est.layout, order, experts)
    if worst == first:
        return placed
    repriced = estimate(model, cluster, job, est.layout, order=order,
                        placement=placement.slots, profile=profile, groups=worst)
    if repriced.step_time_s <= est.step_time_s:
        return placed
    dims = ", ".join(d for d in worst if worst[d] != first[d])
    why = [*placed.why, f"placement: priced on its worst-placed {dims} group(s), which span more "
           f"nodes than the first: {repriced.step_time_s / est.step_time_s - 1:.1%} slower"]
    return replace(placed, estimate=repriced, why=why)


def _candidate(placed: _Placed, model: Model, cluster: Cluster, job: Job,
               topology: ClusterTopology, with_rank_map: bool = True) -> Candidate:
    est, placement = placed.estimate, placed.placement
    stage_layers, stage_notes = placed.stage_layers, list(placed.stage_notes)
    if stage_layers is None:
        split = pipeline_stage_layers(model.num_layers, est.layout.pp, est.layout.vpp)
        if split is not None and len(set(split)) > 1:
            stage_layers = split
            stage_notes = [f"stages: layers {split}: {model.num_layers} layers do not divide "
                           f"over {est.layout.pp} stages, so the first and last (which also "
                           "hold the embedding and the output layer) take fewer"]
    fields = {name: getattr(est, name) for name in Estimate.model_fields}
    fields["mesh_order"] = list(placement.order)
    ranks = rank_map(est.layout, placement, topology) if with_rank_map else []
    return Candidate.model_construct(**fields, rank_map=ranks, why=placed.why + stage_notes,
                                     stage_layers=stage_layers)


def _paced_by_split(placed: _Placed, model: Model, cluster: Cluster, job: Job,
                    topology: ClusterTopology) -> _Placed:
    """``placed`` with its uneven split by GPU speed, when its stages run on different GPU
    types, and its estimate at that split's pace (so the ranking sees the gain)."""
    split = split_for_types(model, cluster, job, placed.estimate.layout, placed.placement,
                            topology)
    if split is not None:
        placed = replace(placed, estimate=_at_stage_pace(placed.estimate, split.pace),
                         stage_layers=split.layers, stage_notes=tuple(split.notes))
    return replace(placed, estimate=_of_used_peaks(placed.estimate, placed.placement, cluster,
                                                   job, topology))


def paced_estimate(model: Model, cluster: Cluster, job: Job, est: Estimate) -> Estimate:
    """``est`` of a layout at its natural placement (a published recipe, the baseline) priced as
    the picks are: at the uneven split's pace when its stages run on different GPU types
    (``_paced_by_split``), so a comparison with the picks is like with like; else unchanged."""
    if not cluster.mixed_node_types:  # no split, MFU of its one GPU type
        return est
    placement = Placement(tuple(est.mesh_order), None, "natural", "")
    topology = topology_of(cluster)
    split = split_for_types(model, cluster, job, est.layout, placement, topology)
    paced = est if split is None else _at_stage_pace(est, split.pace)
    return _of_used_peaks(paced, placement, cluster, job, topology)


def used_peaks_estimate(cluster: Cluster, job: Job, est: Estimate) -> Estimate:
    """``est`` of a layout on the cluster's first GPUs (``placer estimate``) with MFU and HFU
    of the peaks of the GPUs it runs on; unchanged on a cluster of one node type."""
    if not cluster.mixed_node_types:
        return est
    placement = Placement(tuple(est.mesh_order), None, "natural", "")
    return _of_used_peaks(est, placement, cluster, job, topology_of(cluster))


def _of_used_peaks(est: Estimate, placement: Placement, cluster: Cluster, job: Job,
                   topology: ClusterTopology) -> Estimate:
    """``est`` with MFU and HFU of the sum of the peaks of the GPUs its ranks are placed on
    (the cost model divides by every GPU at the slowest one's peak, which on a mixed cluster
    understates the peak: 64 A100 + 64 H100 have 2.1x the peak of 128 A100)."""
    used = used_peak_flops(est.layout, placement, topology, cluster, job.precision)
    if used is None:
        return est
    counted = est.layout.num_gpus * slowest_node_type(cluster).gpu.peak_flops(job.precision)
    return est.model_copy(update={"mfu": est.mfu * counted / used,
                                  "hfu": est.hfu * counted / used})


def _at_stage_pace(est: Estimate, pace: float) -> Estimate:
    """``est`` with the parts that run at the slowest stage's pace (compute, recompute,
    bubble) scaled by ``pace`` (an uneven split by GPU speed), and the rates that follow
    (MFU still of the slowest GPU's peak: ``_of_used_peaks`` then divides by the GPUs')."""
    b = est.breakdown
    breakdown = b.model_copy(update={"compute_s": b.compute_s * pace,
                                     "recompute_s": b.recompute_s * pace,
                                     "pp_bubble_s": b.pp_bubble_s * pace})
    saved_s = (b.compute_s + b.recompute_s + b.pp_bubble_s) * (1.0 - pace)
    step_s = est.step_time_s - saved_s
    faster = est.step_time_s / step_s
    return est.model_copy(update={
        "step_time_s": step_s, "breakdown": breakdown,
        "tokens_per_s": est.tokens_per_s * faster,
        "tflops_per_gpu": est.tflops_per_gpu * faster,
        "hardware_tflops_per_gpu": est.hardware_tflops_per_gpu * faster,
        "mfu": est.mfu * faster, "hfu": est.hfu * faster})


@dataclass(frozen=True)
class Space:
    """The degree tuples a search ranks, and what decided them."""

    topology: ClusterTopology
    tp_capacity: dict[int, int]
    degrees: list[Degrees]
    exact: bool
    """True when every healthy GPU is used with the natural placement (regular clusters)."""
    note: str | None = None
    """Why a regular cluster's GPUs cannot all be used, if they cannot."""


def search_space(model: Model, cluster: Cluster, job: Job) -> Space:
    """Degree tuples under the NVLink rule and the job's constraints; InfeasibleError with the
    tightest reason when there are none (or the GPUs cannot hold the model at all).

    A regular cluster whose GPU count no layout can split (72 GPUs of an NVL72 rack with a
    power-of-two batch) is searched like an irregular one, using fewer GPUs, with a note.
    """
    need = minimum_gpus_needed(model, cluster, job)
    if cluster.num_gpus < need.gpus:
        raise InfeasibleError(need.reason)
    topology = topology_of(cluster)
    exact = cluster.is_regular
    heads = divisors(model.num_attention_heads)
    capacity = tp_capacity(topology, job, heads)
    degrees = degree_tuples(model, job, cluster.num_gpus, capacity, exact=exact)
    note = None
    if not degrees:
        relaxed = tp_capacity(topology, job.model_copy(update={"allow_tp_outside_nvlink": True}),
                              heads)
        reason = no_degrees_reason(model, job, cluster.num_gpus, capacity, relaxed, exact=exact,
                                   nvlink_size=_nvlink_size(cluster))
        if exact:
            degrees = degree_tuples(model, job, cluster.num_gpus, capacity, exact=False)
            exact = False
            note = reason
        if not degrees:
            raise InfeasibleError(reason)
    return Space(topology, capacity, degrees, exact, note)


def recommend(model: Model, cluster: Cluster, job: Job, *, top_k: int = 5,
              profile: LinkProfile | None = None,
              time_limit_s: float = DEFAULT_TIME_LIMIT_S,
              rank_maps: bool = True) -> RecommendResult:
    """The best ``top_k`` distinct layouts with their placements, best first.

    ``time_limit_s`` is CP-SAT's budget in deterministic seconds (about seconds of one core);
    placement gets half of it, so the answer does not depend on machine load. The whole space
    of degree tuples is searched every time (the table's bounds are exact, so nothing that could
    win is skipped): a what-if of the report is this same call on its varied problem.
    Rank maps (one entry per GPU: most of the time at 100,000 GPUs) are written for the final
    candidates only; ``rank_maps=False`` leaves them empty, for callers that read only the
    layouts and their figures (the what-ifs).
    Raises InfeasibleError with the tightest reason when no layout can run.
    """
    started = time.perf_counter()
    memo = CostMemo()  # the validated search costs the same job under one more constraint
    first = _ranked(model, cluster, job, top_k, profile, time_limit_s, memo)
    picks, note = prefer_validated(
        first.placed[:top_k], job,
        lambda validated: _ranked(model, cluster, validated, top_k, profile, time_limit_s,
                                  memo).placed[:top_k], top_k)
    candidates = [_candidate(p, model, cluster, job, first.space.topology, rank_maps)
                  for p in picks]
    if note:
        candidates = [noted(c, job) for c in candidates]
    stats = first.stats.model_copy(update={"wall_s": time.perf_counter() - started})
    return RecommendResult(candidates, stats, first.detail)


@dataclass(frozen=True)
class _Searched:
    """One search's picks, placed and ranked, before any rank map is written."""

    space: Space
    placed: list[_Placed]
    stats: SearchStats
    detail: SearchDetail


def _ranked(model: Model, cluster: Cluster, job: Job, top_k: int, profile: LinkProfile | None,
            time_limit_s: float, memo: CostMemo) -> _Searched:
    """The table, the selection's picks and each pick's best placement, ranked
    (``recommend``)."""
    started = time.perf_counter()
    space = search_space(model, cluster, job)
    topology, capacity, degrees = space.topology, space.tp_capacity, space.degrees
    searched_k = max(top_k, SEARCHED_K_AT_LEAST)
    rows, table = build_table(model, cluster, job, degrees, keep=searched_k, profile=profile,
                              memo=memo)
    if not rows:
        reason = memory_reason(model, cluster, job, table)
        if space.note:
            reason = f"{space.note}; and with fewer GPUs {reason}"
        raise InfeasibleError(reason)
    max_tp = None if job.allow_tp_outside_nvlink else max(capacity)
    selection = select_top(rows, job, [r.layout.num_gpus for r in rows], k=searched_k + EXTRA_PICKS,
                           max_tp=max_tp)
    placed: list[_Placed] = []
    for index in selection.picks:
        found = _best_placement(model, cluster, job, rows[index], topology, profile,
                                time_limit_s / (2 * len(selection.picks)))
        if found is not None:
            placed.append(found)
    if not placed:
        raise InfeasibleError(f"no placement keeps every TP group inside an NVLink domain on "
                              f"{cluster.name}; set allow_tp_outside_nvlink to allow it")
    if not cluster.is_regular:
        placed = [_priced_on_worst_groups(p, model, cluster, job, profile) for p in placed]
        placed = [_paced_by_split(p, model, cluster, job, topology) for p in placed]
    placed.sort(key=lambda p: p.key)
    if space.note:
        placed = [replace(p, why=[f"uses {p.estimate.layout.num_gpus} of {cluster.num_gpus} GPUs "
                                  f"because {space.note}", *p.why]) for p in placed]
    notes = [f"{p.estimate.layout.compact()}: {line}" for p in placed for line in p.why]
    costed = sum(p.costed for p in placed)
    stats = SearchStats(layouts_considered=table.layouts, layouts_feasible=len(rows),
                        solver_status=selection.status, wall_s=time.perf_counter() - started)
    detail = _detail(table, rows, selection.status, selection.solves, costed,
                     placed[0].estimate.layout.num_gpus, notes)
    return _Searched(space, placed, stats, detail)


def _detail(table: TableStats, rows: list[Row], status: str, solves: int, costed: int,
            gpus_used: int, notes: list[str]) -> SearchDetail:
    return SearchDetail(
        degree_tuples=table.degree_tuples, layouts=table.layouts,
        memory_checks=table.memory_checks, estimates=table.estimates, pairs=table.pairs,
        pairs_expanded=table.pairs_expanded, table_rows=len(rows), selection_status=status,
        selection_solves=solves, placements_costed=costed,
        gpus_used=gpus_used,
        bound_violations=table.bound_violations, placement_notes=notes)
