"""The costed table: branch and bound over degree tuples, micro-batches and knobs.

Costing every layout is too slow at scale (GPT-3 on 1,024 GPUs has ~66k; the cost model takes
about a millisecond each), so the search bounds instead of enumerating:

1. Memory: per (degrees, micro-batch) the most memory-saving knobs (full recompute, SP on,
   one virtual stage, the ZeRO stage that needs least) are checked first; if they do not fit,
   no knob setting fits, nor a larger micro-batch (memory only grows with it). A (degrees, ZeRO
   stage) whose weights, gradients and optimizer state alone exceed the GPU
   (``memory.state_floor_bytes``, a lower bound that reads no micro-batch, recomputation or
   SP) is checked at none of them.
2. Recompute: for each (micro-batch, virtual stages, ZeRO, SP) only the least recomputation
   that fits is costed: more recomputation adds work and never removes any.
3. Bounds, from the breakdown (its parts add up to the step time, each >= 0):
   - a degree tuple before anything is costed: its balanced floor (placer.cost.bound: the
     mean stage's forward and backward at its largest micro-batch, from per-layer times shared
     by every pipeline depth and DP degree), once that is within reach its compute floor (the
     slowest stage's, with the bubble), and then the same with the least exposed TP/CP/EP
     traffic added; the tuple is bisected for memory and probed only if that third floor is
     within reach;
   - a (tuple, micro-batch) pair: its floor with exposure at that micro-batch until it comes
     first, then one *probe* per SP setting (ZeRO 0, no recompute, one virtual stage); compute
     and TP/CP/EP exposure do not shrink with ZeRO, interleaving or recompute, and the bubble
     shrinks at most by the largest virtual-stage count;
   - a degree tuple: the probe of its largest micro-batch; per step, compute and TP/CP/EP
     exposure do not grow with the micro-batch (the same tokens in fewer, larger GEMMs and
     messages), and the bubble grows with it at most in proportion;
   - a (virtual stages, SP, ZeRO) setting: the exact step time at one virtual stage and the
     least recomputation that fits there, less its stage-boundary sends, the part of the bubble
     ``vpp`` removes and the part of its exposed ZeRO traffic that a larger overlap window
     (interleaving, recomputation) can hide.
   Nodes are expanded in order of their bound until it exceeds the ``keep``-th best step time
   over distinct degree tuples: nothing beyond can enter the top ``keep`` (each pick of the
   top-K selection uses up at most one of those tuples).
4. Self-check: every bound is compared with the costs it was meant to bound (each costed row,
   each pair under its tuple). If the cost model ever breaks an assumption above, the search
   is redone without bounds, so the answer stays exact and the violation is reported.

``bench/search_speed.py`` compares the result with brute-force enumeration. Placements other
than the natural one (mesh order ``tp-cp-dp-pp``) are searched afterwards, for the top rows.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from placer.cost import estimate, memory_estimate
from placer.cost.bound import (
    LayerFloor,
    StepFloor,
    balanced_floor_s,
    compute_floor,
    layer_floor,
    least_zero_exposed_s,
    with_exposure,
)
from placer.cost.compute import LAYER_FIELDS
from placer.cost.memory import capacity_bytes, state_floor_bytes
from placer.cost.profile import calibration_for
from placer.cost.stack_options import job_options
from placer.solver.space import Degrees, KnobOptions, knob_options, layout_key
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, layout_problem, sp_allowed, zero_allowed
from placer.spec.model import Model
from placer.spec.profile import LinkProfile
from placer.spec.results import Estimate, MemoryBreakdown

BOUND_SLACK = 1e-9
"""Relative float tolerance when checking a bound against the cost it bounds."""


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
    degree_tuples_usable: int = 0
    """Tuples with some knob setting to try: each enters the search at its compute floor."""
    tuples_probed: int = 0
    """Tuples bisected for memory and probed (the others' floor was out of reach)."""
    layouts: int = 0
    memory_checks: int = 0
    estimates: int = 0
    pairs: int = 0
    pairs_expanded: int = 0
    bound_violations: int = 0
    exhaustive: bool = False
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
    """The micro-batches that can fit (one for a pair; before a tuple is probed, those that
    have a virtual-stage option, not yet bisected for memory)."""
    probe: Probe = field(compare=False)
    """For a pair its own probe; for a tuple the probe of its largest micro-batch; empty for a
    tuple not yet probed (its bound is then its floor, ``_floor``)."""
    floors: tuple[StepFloor, ...] = field(compare=False, default=())
    """For a tuple not yet probed, its floor per SP setting (compute alone, then with its
    least exposed per-layer collectives); empty while it is bounded by its balanced floor
    (``_balanced``)."""


@dataclass
class CostMemo:
    """Costs already computed for one model, cluster, job and profile, by ``layout_key``.

    A job's constraints change no cost (they only say which layouts may run), so a search of
    the same job under more constraints (prefer.py's validated search) looks its layouts up
    here instead of costing them again; so does a memory check of a layout already estimated.
    The search builds every layout with ``Degrees.layout``, whose ``layout_key`` names it whole.
    """

    estimates: dict[tuple[int, ...], Estimate] = field(default_factory=dict)
    memory: dict[tuple[int, ...], MemoryBreakdown] = field(default_factory=dict)


class _Search:
    """Cost-model calls for one search, counted, with the bound checks."""

    def __init__(self, model: Model, cluster: Cluster, job: Job, profile: LinkProfile | None,
                 keep: int, bounded: bool, memo: CostMemo | None = None,
                 state_floors: bool = True) -> None:
        self.model, self.cluster, self.job, self.profile = model, cluster, job, profile
        self.keep, self.bounded, self.state_floors = keep, bounded, state_floors
        self.capacity_bytes = capacity_bytes(cluster, job)
        self.over_capacity_at: dict[tuple[Degrees, int], bool] = {}
        self.memo = memo if memo is not None else CostMemo()
        self.stats = TableStats()
        self.best_by_tuple: dict[Degrees, float] = {}
        self.threshold = float("inf")
        self.rows: list[Row] = []
        self.calib = calibration_for(cluster, profile)  # what estimate resolves, once
        self.options = job_options(job)
        self.layer_floors: dict[tuple[object, ...], LayerFloor] = {}

    def balanced_floor(self, degrees: Degrees, mbs: int, sps: Sequence[bool]) -> float:
        """The least ``bound.balanced_floor_s`` of the tuple at ``mbs`` over the SP settings
        ``sps``, the per-layer times computed once per value of the fields ``layer_work`` reads
        (``compute.LAYER_FIELDS``; a field added there that this does not name is a KeyError,
        never a wrong key)."""
        layout = degrees.layout(mbs=mbs)  # the balanced floor reads its pp, dp and mbs only
        values: dict[str, object] = {"tp": degrees.tp, "cp": degrees.cp, "ep": degrees.ep,
                                     "etp": degrees.etp, "micro_batch_size": mbs}
        floors = []
        for sp in sps:
            values["sequence_parallel"] = sp
            key = tuple(values[name] for name in LAYER_FIELDS)
            layers = self.layer_floors.get(key)
            if layers is None:
                layers = layer_floor(self.model, self.job, degrees.layout(mbs=mbs, sp=sp),
                                     self.calib, self.options)
                self.layer_floors[key] = layers
            floors.append(balanced_floor_s(layers, layout, self.job.global_batch_size))
        return min(floors)

    def over_capacity(self, degrees: Degrees, zero: int) -> bool:
        """Whether the tuple at ZeRO ``zero`` and one virtual stage fits at no micro-batch,
        recomputation or SP: its weights, gradients and optimizer state alone
        (``memory.state_floor_bytes``, which reads none of those knobs) exceed the capacity,
        so no memory check of those layouts is made. Lowered by one part in 10^9 against float
        rounding. Off (``state_floors``) where the smallest footprint seen must cover every
        layout (nothing fits: reasons.memory_reason names it)."""
        if not self.state_floors:
            return False
        key = (degrees, zero)
        over = self.over_capacity_at.get(key)
        if over is None:
            floor = state_floor_bytes(self.model, self.job, degrees.layout(zero=zero),
                                      profile=self.profile)
            over = floor * (1.0 - 1e-9) > self.capacity_bytes
            self.over_capacity_at[key] = over
        return over

    def memory(self, layout: Layout) -> MemoryBreakdown:
        self.stats.memory_checks += 1
        key = layout_key(layout)
        memory = self.memo.memory.get(key)
        if memory is None:
            memory = memory_estimate(self.model, self.cluster, self.job, layout,
                                     profile=self.profile)
            self.memo.memory[key] = memory
        self.stats.saw(layout, memory)
        return memory

    def estimate(self, layout: Layout) -> Estimate:
        self.stats.estimates += 1
        key = layout_key(layout)
        est = self.memo.estimates.get(key)
        if est is None:
            est = estimate(self.model, self.cluster, self.job, layout, profile=self.profile)
            self.memo.estimates[key] = est
            self.memo.memory.setdefault(key, est.memory)
        return est

    def check(self, bound_s: float, actual_s: float) -> None:
        if actual_s < bound_s - BOUND_SLACK * max(1.0, abs(bound_s)):
            self.stats.bound_violations += 1

    def within(self, bound_s: float) -> bool:
        return not self.bounded or bound_s <= self.threshold

    def add(self, row: Row) -> None:
        self.rows.append(row)
        best = self.best_by_tuple.get(row.degrees)
        if best is None or row.step_time_s < best:
            self.best_by_tuple[row.degrees] = row.step_time_s
            if len(self.best_by_tuple) >= self.keep:
                self.threshold = sorted(self.best_by_tuple.values())[self.keep - 1]


def _fits(memory: MemoryBreakdown) -> bool:
    return memory.total_bytes <= memory.capacity_bytes


def _least_memory_fits(search: _Search, degrees: Degrees, mbs: int) -> bool:
    """Whether any knob setting of (degrees, mbs) can fit: try the most saving ones."""
    sp = sp_allowed(degrees.tp, search.job.seq_len)
    zeros = (3, 2, 1) if zero_allowed(degrees.dp, degrees.cp) else (0,)
    return any(not search.over_capacity(degrees, z)
               and _fits(search.memory(degrees.layout(mbs=mbs, zero=z, recompute="full", sp=sp)))
               for z in zeros)


def _sp_settings(search: _Search, degrees: Degrees) -> list[bool]:
    """The SP settings a tuple's probe and floors cover: on only where SP can apply."""
    return [False, True] if sp_allowed(degrees.tp, search.job.seq_len) else [False]


def _tuple_key(degrees: Degrees) -> tuple[int, ...]:
    """A node's tie-breaking key: its degrees, in a fixed order."""
    return (degrees.tp, degrees.pp, degrees.dp, degrees.cp, degrees.ep, degrees.etp)


def _probe(search: _Search, degrees: Degrees, mbs: int) -> Probe:
    """One estimate per SP setting: ZeRO 0, no recompute, one virtual stage."""
    sps = _sp_settings(search, degrees)
    return tuple((sp, search.estimate(degrees.layout(mbs=mbs, sp=sp))) for sp in sps)


def _work(est: Estimate) -> float:
    """Compute and TP/CP/EP exposure: the parts no knob but the micro-batch can shrink."""
    b = est.breakdown
    return b.compute_s + b.tp_exposed_s + b.cp_exposed_s + b.ep_exposed_s


def _vpp_max(options: KnobOptions, mbs: int) -> int:
    return max(options.vpp_by_mbs[options.mbs.index(mbs)])


def _pair(degrees: Degrees, options: KnobOptions, mbs: int, probe: Probe) -> _Node:
    vpp_max = _vpp_max(options, mbs)
    bound = min(_work(e) + e.breakdown.pp_bubble_s / vpp_max for _, e in probe)
    key = (*_tuple_key(degrees), mbs)
    return _Node(bound, False, key, degrees, options, (mbs,), probe)


def _tuple(search: _Search, degrees: Degrees, options: KnobOptions,
           mbs: tuple[int, ...]) -> _Node:
    """Bound over every micro-batch of a tuple from the probe of the largest one."""
    largest, smallest = mbs[-1], mbs[0]
    probe = _probe(search, degrees, largest)
    vpp_max = max(_vpp_max(options, m) for m in mbs)
    bound = min(_work(e) + e.breakdown.pp_bubble_s * smallest / largest / vpp_max
                for _, e in probe)
    key = _tuple_key(degrees)
    return _Node(bound, True, key, degrees, options, mbs, probe)


def _setting_bound(search: _Search, base: Estimate, vpp: int) -> float:
    """A bound on a setting at ``vpp`` virtual stages from its ``base`` (one virtual stage, the
    least recomputation that fits there): the same step less its stage-boundary sends, the part
    of the bubble interleaving removes, and the part of its exposed ZeRO traffic a larger
    overlap window can hide (ZeRO-2's per-micro-batch reduce-scatters hide behind a window that
    grows with interleaving and recomputation, step._zero_per_microbatch; only the share no
    window hides holds, placer.cost.bound.least_zero_exposed_s)."""
    b = base.breakdown
    return (base.step_time_s - b.pp_p2p_s - b.zero_exposed_s - b.pp_bubble_s * (1 - 1 / vpp)
            + least_zero_exposed_s(base, search.calib))


def _expand(search: _Search, pair: _Node) -> None:
    """Cost the pair's knob settings in order of their own bound while it is within reach.

    Each (SP, ZeRO) first costs its *base*: the exact estimate at one virtual stage and the least
    recomputation that fits there (memory only grows with interleaving, and more recomputation
    only adds work, so no setting of that (SP, ZeRO) runs with less). The base is computed
    lazily, under the pair's bound for that SP setting, so a threshold that drops while the pair
    is expanded also saves it; each virtual-stage count then enters at the base less what
    interleaving can remove. A layout's memory is checked before it is estimated.
    """
    options, degrees, mbs = pair.options, pair.degrees, pair.mbs[0]
    vpps = options.vpp_by_mbs[options.mbs.index(mbs)]
    vpp_max = max(vpps)
    probe = dict(pair.probe)
    base: dict[tuple[bool, int], tuple[int, Estimate]] = {}
    heap: list[tuple[float, int, int, bool, int]] = [
        (_work(probe[sp]) + probe[sp].breakdown.pp_bubble_s / vpp_max, 0, 0, sp, zero)
        for sp in options.sp for zero in options.zero]
    heapq.heapify(heap)
    one_stage: dict[tuple[bool, int, str], MemoryBreakdown] = {
        (sp, 0, "none"): e.memory for sp, e in pair.probe}

    def fits_one_stage(sp: bool, zero: int, recompute: str) -> bool:
        """Whether the setting fits with one virtual stage. Interleaving holds at least as many
        micro-batches in flight (Megatron: p + (p-1)/v against p), so a setting that does not
        fit with one virtual stage is not costed with more."""
        key = (sp, zero, recompute)
        if key not in one_stage:
            if search.over_capacity(degrees, zero):
                return False
            one_stage[key] = search.memory(degrees.layout(mbs=mbs, zero=zero,
                                                          recompute=recompute, sp=sp))
        return _fits(one_stage[key])

    while heap:
        bound, needs_base, vpp, sp, zero = heapq.heappop(heap)
        if not search.within(bound):
            break
        if needs_base == 0:
            least = next((i for i, r in enumerate(options.recompute)
                          if fits_one_stage(sp, zero, r)), None)
            if least is None:
                continue  # no recomputation fits at one virtual stage, so none with more
            recompute = options.recompute[least]
            est = (probe[sp] if zero == 0 and recompute == "none" else
                   search.estimate(degrees.layout(mbs=mbs, zero=zero, recompute=recompute,
                                                  sp=sp)))
            base[(sp, zero)] = (least, est)
            search.check(bound, est.step_time_s)
            for v in vpps:
                heapq.heappush(heap, (_setting_bound(search, est, v), 1, v, sp, zero))
            continue
        least, base_est = base[(sp, zero)]
        for recompute in options.recompute[least:]:
            layout = degrees.layout(vpp=vpp, mbs=mbs, zero=zero, recompute=recompute, sp=sp)
            if layout_problem(layout, search.model, search.job, degrees.num_gpus):
                continue
            if not fits_one_stage(sp, zero, recompute):
                continue
            if vpp == 1:
                memory = one_stage[(sp, zero, recompute)]
                search.stats.saw(layout, memory)
            else:
                memory = search.memory(layout)
            if not _fits(memory):
                continue
            reuse = vpp == 1 and recompute == options.recompute[least]
            est = base_est if reuse else search.estimate(layout)
            search.check(bound, est.step_time_s)
            search.check(pair.bound_s, est.step_time_s)
            search.add(Row(layout, est.step_time_s, memory.total_bytes, memory.capacity_bytes,
                           est))
            break  # more recomputation only adds work


def _floor(search: _Search, degrees: Degrees, options: KnobOptions, usable: tuple[int, ...],
           floors: tuple[StepFloor, ...] = ()) -> _Node:
    """A degree tuple not yet bisected for memory nor probed, bounded by its floor
    (placer.cost.bound) at its largest micro-batch, composed as ``_tuple`` composes the probe:
    compute, and then the least TP, CP and EP exposure (which the probe's exposure is at least),
    plus the bubble, scaled to the smallest micro-batch and the most virtual stages. Per step
    they do not grow with the micro-batch, so this is at most the probe bound of the
    micro-batches that fit. Without ``floors`` the compute floors, else those with exposure."""
    sps = _sp_settings(search, degrees)
    largest, smallest = usable[-1], usable[0]
    vpp_max = max(_vpp_max(options, m) for m in usable)
    layouts = [degrees.layout(mbs=largest, sp=sp) for sp in sps]
    model, job, calib, opts = search.model, search.job, search.calib, search.options
    if floors:
        floors = tuple(with_exposure(model, search.cluster, job, layout, floor, calib, opts)
                       for layout, floor in zip(layouts, floors, strict=True))
    else:
        floors = tuple(compute_floor(model, job, layout, calib, opts) for layout in layouts)
    bound = min(f.work_s + f.bubble_s * smallest / largest / vpp_max for f in floors)
    key = _tuple_key(degrees)
    return _Node(bound, True, key, degrees, options, usable, (), floors)


def _balanced(search: _Search, degrees: Degrees, options: KnobOptions,
              usable: tuple[int, ...]) -> _Node:
    """A degree tuple as it enters the search: bounded by its balanced floor at its largest
    micro-batch (``bound.balanced_floor_s``: the mean pipeline rank's forward + backward, a few
    multiplications per tuple once each per-layer time is known), at most ``_floor``'s compute
    floor, whose stage shapes and bubble it computes only when this comes first."""
    bound = search.balanced_floor(degrees, usable[-1], _sp_settings(search, degrees))
    return _Node(bound, True, _tuple_key(degrees), degrees, options, usable, ())


def _pair_floor(search: _Search, node: _Node, mbs: int) -> _Node:
    """A (tuple, micro-batch) pair not yet probed: bounded by its floor with exposure at that
    micro-batch (``_floor``'s, with the bubble at the pair's most virtual stages) and by its
    probed tuple's bound, both at most its probe bound (``_pair``)."""
    degrees, options = node.degrees, node.options
    computed = _floor(search, degrees, options, (mbs,))
    exposed = _floor(search, degrees, options, (mbs,), computed.floors)
    bound = max(node.bound_s, exposed.bound_s)
    key = (*_tuple_key(degrees), mbs)
    return _Node(bound, False, key, degrees, options, (mbs,), ())


def _fitting(search: _Search, degrees: Degrees, usable: tuple[int, ...]) -> tuple[int, ...]:
    """The micro-batches of ``usable`` that can fit: memory only grows with the micro-batch, so
    they are a prefix; its end found by bisection."""
    low, high = 0, len(usable)
    while low < high:
        middle = (low + high) // 2
        if _least_memory_fits(search, degrees, usable[middle]):
            low = middle + 1
        else:
            high = middle
    return usable[:low]


def _run(model: Model, cluster: Cluster, job: Job, degrees_list: Sequence[Degrees], keep: int,
         profile: LinkProfile | None, bounded: bool, memo: CostMemo | None,
         state_floors: bool = True) -> _Search:
    search = _Search(model, cluster, job, profile, keep, bounded, memo, state_floors)
    stats = search.stats
    stats.degree_tuples = len(degrees_list)
    heap: list[_Node] = []
    for degrees in degrees_list:
        options = knob_options(degrees, model, job)
        stats.layouts += options.count()
        if not options.zero or not options.recompute or not options.sp:
            continue
        usable = tuple(m for m, v in zip(options.mbs, options.vpp_by_mbs, strict=True) if v)
        if usable:
            stats.degree_tuples_usable += 1
            heap.append(_balanced(search, degrees, options, usable))
    heapq.heapify(heap)
    # A tuple enters at its balanced floor (no stage shapes, no probe, no links); when it comes
    # first it goes back at its compute floor, then at its floor with exposure, then (when that
    # comes first) it is bisected and probed and goes back at its probe bound; each bound is at
    # least the one before. The nodes with their real bounds thus leave the heap in the order
    # they would if every tuple were probed first, and the threshold falls alike: the same
    # tuples, fewer estimates.
    while heap:
        node = heapq.heappop(heap)
        if not search.within(node.bound_s):
            break
        if node.is_tuple and not node.probe and not node.floors:
            floored = _floor(search, node.degrees, node.options, node.mbs)
            search.check(node.bound_s, floored.bound_s)
            heapq.heappush(heap, floored)
            continue
        if node.is_tuple and not node.probe and not node.floors[0].exposed:
            exposed = _floor(search, node.degrees, node.options, node.mbs, node.floors)
            search.check(node.bound_s, exposed.bound_s)
            heapq.heappush(heap, exposed)
            continue
        if node.is_tuple and not node.probe:
            stats.tuples_probed += 1
            fitting = _fitting(search, node.degrees, node.mbs)
            if fitting:
                probed = _tuple(search, node.degrees, node.options, fitting)
                search.check(node.bound_s, probed.bound_s)
                heapq.heappush(heap, probed)
            continue
        if node.is_tuple:
            for mbs in node.mbs:
                if mbs == node.mbs[-1]:
                    pair = _pair(node.degrees, node.options, mbs, node.probe)
                    search.check(node.bound_s, pair.bound_s)
                else:  # probed only when its floor comes first, like a tuple
                    pair = _pair_floor(search, node, mbs)
                stats.pairs += 1
                heapq.heappush(heap, pair)
            continue
        if not node.probe:
            pair = _pair(node.degrees, node.options, node.mbs[0],
                         _probe(search, node.degrees, node.mbs[0]))
            search.check(node.bound_s, pair.bound_s)
            heapq.heappush(heap, pair)
            continue
        stats.pairs_expanded += 1
        _expand(search, node)
    return search


def build_table(model: Model, cluster: Cluster, job: Job, degrees_list: Sequence[Degrees], *,
                keep: int, profile: LinkProfile | None = None,
                memo: CostMemo | None = None) -> tuple[list[Row], TableStats]:
    """Costed rows that fit, enough to hold the best ``keep`` distinct candidates exactly.
    ``memo`` carries costs between searches of the same inputs but for the job's constraints."""
    memo = memo if memo is not None else CostMemo()
    search = _run(model, cluster, job, degrees_list, keep, profile, bounded=True, memo=memo)
    if search.stats.bound_violations:
        violations = search.stats.bound_violations
        search = _run(model, cluster, job, degrees_list, keep, profile, bounded=False, memo=memo)
        search.stats.bound_violations = violations
        search.stats.exhaustive = True
    if not search.rows:  # nothing fits: every footprint checked, for the smallest one seen
        stats = search.stats
        search = _run(model, cluster, job, degrees_list, keep, profile, bounded=False, memo=memo,
                      state_floors=False)
        search.stats.bound_violations = stats.bound_violations
        search.stats.exhaustive = stats.exhaustive
    return pareto_rows(search.rows), search.stats


def exhaustive_rows(model: Model, cluster: Cluster, job: Job, degrees_list: Sequence[Degrees],
                    profile: LinkProfile | None = None) -> tuple[list[Row], int]:
    """Every layout of the space costed, no bounds (the brute force ``build_table`` must
    agree with; benchmarks and tests only). Returns the rows that fit and the layouts costed."""
    rows: list[Row] = []
    costed = 0
    for degrees in degrees_list:
        options = knob_options(degrees, model, job)
        for mbs, vpps in zip(options.mbs, options.vpp_by_mbs, strict=True):
            for vpp in vpps:
                for zero in options.zero:
                    for recompute in options.recompute:
                        for sp in options.sp:
                            layout = degrees.layout(vpp=vpp, mbs=mbs, zero=zero,
                                                    recompute=recompute, sp=sp)
                            if layout_problem(layout, model, job, degrees.num_gpus):
                                continue
                            costed += 1
                            est = estimate(model, cluster, job, layout, profile=profile)
                            if est.fits:
                                rows.append(Row(layout, est.step_time_s, est.peak_memory_bytes,
                                                est.memory.capacity_bytes, est))
    return sorted(rows, key=lambda r: r.key), costed


def least_recompute(rows: Sequence[Row]) -> list[Row]:
    """Per knob setting, only the least recomputation that fits (the table's policy)."""
    kept: dict[tuple[int, ...], Row] = {}
    for row in rows:
        key = layout_key(row.layout)
        setting = key[:9] + key[10:]  # everything but the recompute index
        if setting not in kept or key < layout_key(kept[setting].layout):
            kept[setting] = row
    return list(kept.values())


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
