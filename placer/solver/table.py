"""The costed table: branch and bound over degree tuples and micro-batch sizes.

Costing every layout is too slow at scale (GPT-3 on 1,024 GPUs has ~100k; the cost model takes
~0.3 ms each), so the search bounds instead of enumerating, and stays exact:

1. Memory: per (degrees, micro-batch) the most memory-saving knobs (full recompute, SP on,
   one virtual stage, the ZeRO stage that needs least) are checked first; if they do not fit,
   no knob setting fits, nor a larger micro-batch (memory only grows with it).
2. Bound: two *probes* per pair (SP off/on, ZeRO 0, no recompute, one virtual stage) give a
   lower bound on the step time of every knob setting of the pair: the step time is the sum of
   the breakdown's parts, each >= 0, and compute, TP/CP/EP exposure and stage-boundary sends are
   least without recompute and without interleaving, while the bubble shrinks at most by the
   largest virtual-stage count. Pairs are expanded in order of their bound until the bound
   exceeds the K-th best step time found over distinct degree tuples: no row beyond can enter
   the top K (each pick uses up at most one of those K tuples).
3. Recompute: inside a pair, for each (virtual stages, ZeRO, SP) only the least recomputation
   that fits is costed: more recomputation adds work and never removes any.

``bench/search_speed.py`` checks the result against brute-force enumeration. Placements other
than the natural one (mesh order ``tp-cp-dp-pp``) are searched afterwards, for the top rows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from placer.cost import estimate, memory_estimate
from placer.solver.space import Degrees, KnobOptions, knob_options, layout_key
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, layout_problem
from placer.spec.model import Model
from placer.spec.profile import LinkProfile
from placer.spec.results import Estimate, MemoryBreakdown


@dataclass(frozen=True)
class Row:
    """One costed layout (natural placement) that fits in memory."""

    layout: Layout
    step_time_s: float
    memory_bytes: int
    capacity_bytes: int
    estimate: Estimate

    @property
    def degrees(self) -> Degrees:
        return Degrees.of(self.layout)

    @property
    def key(self) -> tuple[float, tuple[int, ...]]:
        return (self.step_time_s, layout_key(self.layout))


@dataclass
class TableStats:
    """What the search looked at; ``smallest`` is the least memory any layout needed."""

    degree_tuples: int = 0
    layouts: int = 0
    memory_checks: int = 0
    estimates: int = 0
    pairs: int = 0
    pairs_expanded: int = 0
    smallest: tuple[int, Layout, MemoryBreakdown] | None = field(default=None, repr=False)

    def saw(self, layout: Layout, memory: MemoryBreakdown) -> None:
        if self.smallest is None or (memory.total_bytes, layout_key(layout)) < (
                self.smallest[0], layout_key(self.smallest[1])):
            self.smallest = (memory.total_bytes, layout, memory)


Probe = tuple[tuple[bool, Estimate], ...]
"""Per SP setting, the estimate at ZeRO 0, no recompute and one virtual stage."""


@dataclass(frozen=True, order=True)
class _Node:
    """A search node: a degree tuple (all its micro-batches) or one (tuple, micro-batch) pair."""

    bound_s: float
    is_tuple: bool
    key: tuple[int, ...]
    degrees: Degrees = field(compare=False)
    options: KnobOptions = field(compare=False)
    mbs: tuple[int, ...] = field(compare=False)
    """The micro-batches that can fit (one for a pair)."""
    probe: Probe = field(compare=False)
    """For a pair its own probe; for a tuple the probe of its largest micro-batch."""


class _Costing:
    """Cost-model calls for one search, counted."""

    def __init__(self, model: Model, cluster: Cluster, job: Job,
                 profile: LinkProfile | None, stats: TableStats) -> None:
        self.model, self.cluster, self.job, self.stats = model, cluster, job, stats
        self.profile = profile

    def memory(self, layout: Layout) -> MemoryBreakdown:
        self.stats.memory_checks += 1
        memory = memory_estimate(self.model, self.cluster, self.job, layout)
        self.stats.saw(layout, memory)
        return memory

    def estimate(self, layout: Layout) -> Estimate:
        self.stats.estimates += 1
        return estimate(self.model, self.cluster, self.job, layout, profile=self.profile)


def _fits(memory: MemoryBreakdown) -> bool:
    return memory.total_bytes <= memory.capacity_bytes


def _least_memory_fits(cost: _Costing, degrees: Degrees, mbs: int) -> bool:
    """Whether any knob setting of (degrees, mbs) can fit: try the most saving ones."""
    sp = degrees.tp > 1 and cost.job.seq_len % degrees.tp == 0
    zeros = (3, 2, 1) if degrees.dp * degrees.cp > 1 else (0,)
    return any(_fits(cost.memory(degrees.layout(mbs=mbs, zero=z, recompute="full", sp=sp)))
               for z in zeros)


def _probe(cost: _Costing, degrees: Degrees, mbs: int) -> Probe:
    """One estimate per SP setting: ZeRO 0, no recompute, one virtual stage."""
    sps = [False, True] if degrees.tp > 1 and cost.job.seq_len % degrees.tp == 0 else [False]
    return tuple((sp, cost.estimate(degrees.layout(mbs=mbs, sp=sp))) for sp in sps)


def _work(est: Estimate) -> float:
    """Compute and TP/CP/EP exposure: the parts that do not shrink with a larger micro-batch."""
    b = est.breakdown
    return b.compute_s + b.tp_exposed_s + b.cp_exposed_s + b.ep_exposed_s


def _vpp_max(options: KnobOptions, mbs: int) -> int:
    return max(options.vpp_by_mbs[options.mbs.index(mbs)])


def _pair(degrees: Degrees, options: KnobOptions, mbs: int, probe: Probe) -> _Node:
    vpp_max = _vpp_max(options, mbs)
    bound = min(_work(e) + e.breakdown.pp_p2p_s + e.breakdown.pp_bubble_s / vpp_max
                for _, e in probe)
    key = (degrees.tp, degrees.pp, degrees.dp, degrees.cp, degrees.ep, degrees.etp, mbs)
    return _Node(bound, False, key, degrees, options, (mbs,), probe)


def _tuple(cost: _Costing, degrees: Degrees, options: KnobOptions,
           mbs: tuple[int, ...]) -> _Node:
    """Bound over every micro-batch of a tuple from the probe of the largest one.

    Per step, compute and TP/CP/EP exposure do not grow with the micro-batch (the same tokens
    in fewer, larger GEMMs and messages, so fixed costs are paid fewer times); the bubble grows
    with it, at most in proportion, so the smallest micro-batch's bubble is at least
    ``mbs_min / mbs_max`` of the largest's. Stage-boundary sends are left out (they are >= 0).
    """
    largest, smallest = mbs[-1], mbs[0]
    probe = _probe(cost, degrees, largest)
    vpp_max = max(_vpp_max(options, m) for m in mbs)
    bound = min(_work(e) + e.breakdown.pp_bubble_s * smallest / largest / vpp_max
                for _, e in probe)
    key = (degrees.tp, degrees.pp, degrees.dp, degrees.cp, degrees.ep, degrees.etp)
    return _Node(bound, True, key, degrees, options, mbs, probe)


class _Best:
    """Best step time per degree tuple; the threshold is the ``keep``-th best of them."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.by_tuple: dict[Degrees, float] = {}
        self.threshold = float("inf")

    def add(self, row: Row) -> None:
        best = self.by_tuple.get(row.degrees)
        if best is None or row.step_time_s < best:
            self.by_tuple[row.degrees] = row.step_time_s
            if len(self.by_tuple) >= self.keep:
                self.threshold = sorted(self.by_tuple.values())[self.keep - 1]


def _expand(cost: _Costing, pair: _Node, best: _Best, rows: list[Row]) -> None:
    """Cost the pair's knob settings in order of their own bound while it is within reach.

    The bound of (vpp, sp, zero) is the exact step time at one virtual stage and no recompute,
    less the part of the bubble that ``vpp`` virtual stages remove (their extra sends only add).
    """
    options, degrees, mbs = pair.options, pair.degrees, pair.mbs[0]
    vpps = options.vpp_by_mbs[options.mbs.index(mbs)]
    base: dict[tuple[bool, int], Estimate] = {(sp, 0): e for sp, e in pair.probe}
    combos = []
    for sp in options.sp:
        for zero in options.zero:
            if (sp, zero) not in base:
                base[(sp, zero)] = cost.estimate(degrees.layout(mbs=mbs, zero=zero, sp=sp))
            est = base[(sp, zero)]
            for vpp in vpps:
                bound = est.step_time_s - est.breakdown.pp_bubble_s * (1 - 1 / vpp)
                combos.append((bound, vpp, sp, zero))
    combos.sort()
    one_stage: dict[tuple[bool, int, str], MemoryBreakdown] = {
        (sp, zero, "none"): e.memory for (sp, zero), e in base.items()}

    def memory_at(vpp: int, sp: bool, zero: int, recompute: str) -> MemoryBreakdown | None:
        """Memory if it fits, else None. Interleaving holds at least as many micro-batches
        in flight as one virtual stage (Megatron: p + (p-1)/v against p), so a setting that
        does not fit with one virtual stage is not checked again with more."""
        key = (sp, zero, recompute)
        if key not in one_stage:
            one_stage[key] = cost.memory(degrees.layout(mbs=mbs, zero=zero,
                                                        recompute=recompute, sp=sp))
        memory = one_stage[key]
        if vpp > 1 and _fits(memory):
            memory = cost.memory(degrees.layout(vpp=vpp, mbs=mbs, zero=zero,
                                                recompute=recompute, sp=sp))
        return memory if _fits(memory) else None

    for bound, vpp, sp, zero in combos:
        if bound > best.threshold:
            break
        for recompute in options.recompute:
            layout = degrees.layout(vpp=vpp, mbs=mbs, zero=zero, recompute=recompute, sp=sp)
            if layout_problem(layout, cost.model, cost.job, degrees.num_gpus):
                continue
            fitting = memory_at(vpp, sp, zero, recompute)
            if fitting is None:
                continue
            memory = fitting
            if vpp == 1 and recompute == "none":
                est = base[(sp, zero)]
                cost.stats.saw(layout, memory)
            else:
                est = cost.estimate(layout)
            row = Row(layout, est.step_time_s, memory.total_bytes, memory.capacity_bytes, est)
            rows.append(row)
            best.add(row)
            break  # more recomputation only adds work


def build_table(model: Model, cluster: Cluster, job: Job, degrees_list: Sequence[Degrees], *,
                keep: int, profile: LinkProfile | None = None) -> tuple[list[Row], TableStats]:
    """Costed rows that fit, enough to hold the best ``keep`` distinct candidates exactly."""
    stats = TableStats(degree_tuples=len(degrees_list))
    cost = _Costing(model, cluster, job, profile, stats)
    heap: list[_Node] = []
    for degrees in degrees_list:
        options = knob_options(degrees, model, job)
        stats.layouts += options.count()
        if not options.zero or not options.recompute or not options.sp:
            continue
        fitting: list[int] = []
        for mbs in options.mbs:
            if not options.vpp_by_mbs[options.mbs.index(mbs)]:
                continue
            if not _least_memory_fits(cost, degrees, mbs):
                break  # a larger micro-batch needs more memory still
            fitting.append(mbs)
        if fitting:
            heap.append(_tuple(cost, degrees, options, tuple(fitting)))
    heapq.heapify(heap)
    best = _Best(keep)
    rows: list[Row] = []
    while heap:
        node = heapq.heappop(heap)
        if node.bound_s > best.threshold:
            break
        if node.is_tuple:
            for mbs in node.mbs:
                probe = node.probe if mbs == node.mbs[-1] else _probe(cost, node.degrees, mbs)
                stats.pairs += 1
                heapq.heappush(heap, _pair(node.degrees, node.options, mbs, probe))
            continue
        stats.pairs_expanded += 1
        _expand(cost, node, best, rows)
    return pareto_rows(rows), stats


def pareto_rows(rows: Sequence[Row]) -> list[Row]:
    """Drop rows another row of the same degrees beats on both step time and memory; sorted."""
    by_degrees: dict[Degrees, list[Row]] = {}
    for row in rows:
        by_degrees.setdefault(row.degrees, []).append(row)
    kept: list[Row] = []
    for group in by_degrees.values():
        group.sort(key=lambda r: (r.step_time_s, r.memory_bytes, layout_key(r.layout)))
        least_memory = None
        for row in group:
            if least_memory is None or row.memory_bytes < least_memory:
                kept.append(row)
                least_memory = row.memory_bytes
    return sorted(kept, key=lambda r: r.key)
