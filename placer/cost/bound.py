"""Cheap lower bounds on a layout's step time, from the same pure pieces ``estimate`` composes.

The search (placer.solver.table) would price every degree tuple with one or two full estimates
before it could bound it; most tuples then turn out far slower than the best ones. So a tuple
enters at its compute floor (``compute_floor``: per-layer work, GEMM and kernel times, no links,
about a third of an estimate), then, if that is within reach, at the floor with its least
exposed per-layer TP, CP and EP traffic on the natural placement's group links added
(``with_exposure``; no memory, data-parallel or ZeRO traffic, stage sends or optimizer), and is
estimated only if that is within reach too. ``least_zero_exposed_s`` is the ZeRO-2/3 traffic no
overlap window can hide, which the table keeps in its per-setting bound.

Why it is a lower bound of ``estimate``: the step time is the sum of the breakdown's parts, each
>= 0, and ``compute_s`` plus the TP, CP and EP exposure is ``m`` times the forward + backward
and the exposed per-layer collectives of the stage that is slowest in total; that stage's total
is at least any stage's, which is at least what this adds up for it:
- compute as ``estimate_with`` composes a stage's (its dense and MoE layers' pass times, plus
  the output layer on the last stage; recomputation and an offload stall, both >= 0, left out);
- TP: the per-layer collectives of ``step.tp_per_layer``; where they are pipelined with their
  GEMMs (``step._tp_overlapped_layer_s``) each still shows at least ``1 - tp_overlap_efficiency``
  of itself and at least its first chunk (``1/tp``), so that share of the whole;
- EP: the dispatch and combine of ``step.ep_per_layer``; hidden behind the other micro-batch
  (``--overlap-moe-expert-parallel-comm``, DualPipe) at least ``1 - overlap_efficiency`` of it
  stays exposed (``step._overlapped``, whatever the window);
- CP: ``step.cp_exposed_s`` itself, at one forward pass (recomputation only adds a redo);
and the bubble (``pipeline.bubble_s``) of the mean stage's bound, which never shrinks as a
stage's forward or backward grows. Recomputation only adds passes and calls, so the bound holds
for every recompute mode, ZeRO stage and interleaving of the degrees and micro-batch. The search
checks the bound against the estimates it then makes and redoes the search without bounds if
the cost model ever breaks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placer.cost.compute import (
    LAYER_FIELDS,
    PassTimes,
    attention_forward_s,
    layer_work,
    linear_precision,
    logits_work,
    pass_times,
    tokens_per_gpu,
)
from placer.cost.groups import group_links
from placer.cost.memo import (
    BATCH_FIELDS,
    DP_FIELDS,
    cached,
    constants_key,
    layout_fields,
    new_cache,
    text_key,
)
from placer.cost.options import CostOptions
from placer.cost.params import StageShape, num_moe_layers, stage_shapes
from placer.cost.pipeline import bubble_s
from placer.cost.profile import Calibration
from placer.cost.step import cp_exposed_s, ep_per_layer, tp_per_layer
from placer.dims import DEFAULT_ORDER, Group, Part
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.results import Estimate

FLOOR_GROUPS = frozenset({Group.TP, Group.CP, Group.EP})
"""The groups whose per-layer collectives the floor prices."""


@dataclass(frozen=True)
class StepFloor:
    """Parts of a layout's step that its compute (and, with ``exposed``, its per-layer
    collectives) alone fix, each <= the estimate's part."""

    work_s: float
    """Forward + backward (and the least exposed TP, CP and EP traffic) of the slowest stage
    over the step's micro-batches: <= the breakdown's compute plus its TP, CP and EP exposure."""
    bubble_s: float
    """The schedule's bubble (placer.cost.pipeline.bubble_s) of the mean stage's floor:
    <= the breakdown's ``pp_bubble_s``, whose stages carry at least that much."""
    exposed: bool
    """Whether the per-layer collectives are in (``with_exposure``), or compute alone."""
    stages: tuple[tuple[StageShape, PassTimes], ...] = field(repr=False, compare=False)
    """Each pipeline rank's compute per micro-batch, for ``with_exposure``."""
    attention_forward_s: float = field(repr=False, compare=False, default=0.0)
    """A dense layer's core-attention forward on one GPU (what the CP ring hides behind)."""


Stages = tuple[tuple[StageShape, PassTimes], ...]
_STAGES: dict[tuple[object, ...], tuple[Stages, float]] = new_cache()
_EXPOSED: dict[tuple[object, ...], tuple[float, ...]] = new_cache()


def _batch_free_key(model: Model, job: Job, layout: Layout, calib: Calibration,
                    options: CostOptions, exclude: tuple[str, ...] = ()
                    ) -> tuple[object, ...] | None:
    """The cache key of a floor's per-micro-batch parts, which never read the global batch (only
    ``_floor``'s ``m`` does): a what-if at half or twice the batch, forked after the main search,
    finds its tuples' floors there; without the layout's fields in ``exclude`` (the stages'
    compute reads no data-parallel field, memo.DP_FIELDS: twice the nodes finds its tuples'
    stages too). None for constants not from ``calibration_for`` (a fit's tuned copy), which
    are costed afresh."""
    constants = constants_key(calib)
    if constants is None:
        return None
    return (text_key(model), text_key(job, BATCH_FIELDS), layout_fields(layout, exclude),
            constants, options)


def compute_floor(model: Model, job: Job, layout: Layout, calib: Calibration,
                  options: CostOptions) -> StepFloor:
    """The compute floor of ``layout`` at any placement (``estimate_with``'s composition of a
    stage's compute; its communication and offload stall left out), with the hardware constants
    (``profile.calibration_for``) and runtime settings (``stack_options.job_options``) that
    ``estimate`` resolves. Each stage's pass times are cached without the global batch and
    the data-parallel fields (``_batch_free_key``)."""
    key = _batch_free_key(model, job, layout, calib, options, DP_FIELDS)
    if key is None:
        stages, attention_s = _stage_times(model, job, layout, calib, options)
    else:
        stages, attention_s = cached(_STAGES, key,
                                     lambda: _stage_times(model, job, layout, calib, options))
    return _floor(job, layout, stages, [0.0] * len(stages), False, attention_s)


def _stage_times(model: Model, job: Job, layout: Layout, calib: Calibration,
                 options: CostOptions) -> tuple[Stages, float]:
    """Each pipeline rank's compute per micro-batch, and a dense layer's core-attention
    forward (``compute_floor``)."""
    precision = linear_precision(job, options)
    dense_work = layer_work(model, job, layout, False, options)
    dense = pass_times(dense_work, calib, precision, "none")
    moe = (pass_times(layer_work(model, job, layout, True, options), calib, precision, "none")
           if model.moe is not None else None)
    head = pass_times(logits_work(model, job, layout), calib, "bf16", "none", is_layer=False)
    by_kind: dict[tuple[int, int, bool, bool], PassTimes] = {}
    stages = []
    for shape in stage_shapes(model, layout):
        if shape.kind not in by_kind:
            stage = dense.scaled(shape.layers - shape.moe_layers)
            if moe is not None:
                stage = stage + moe.scaled(shape.moe_layers)
            by_kind[shape.kind] = stage + head if shape.last else stage
        stages.append((shape, by_kind[shape.kind]))
    return tuple(stages), attention_forward_s(dense_work, calib)


@dataclass(frozen=True)
class LayerFloor:
    """One dense and one MoE layer's forward + backward at a layout's per-layer fields (TP, CP,
    EP, expert TP, micro-batch, SP: ``compute.LAYER_FIELDS``), no recomputation, and the model's
    dense and MoE layer counts: what ``balanced_floor_s`` multiplies out per pipeline depth and
    data-parallel degree."""

    dense_s: float
    moe_s: float
    dense_layers: int
    moe_layers: int


def layer_floor(model: Model, job: Job, layout: Layout, calib: Calibration,
                options: CostOptions) -> LayerFloor:
    """``LayerFloor`` of ``layout``: the per-layer pass times ``compute_floor`` composes,
    cached on the fields ``layer_work`` reads (``compute.LAYER_FIELDS``) without the global
    batch, so a what-if's search finds those of the main search."""
    constants = constants_key(calib)
    if constants is None:
        return _layer_floor(model, job, layout, calib, options)
    key = (text_key(model), text_key(job, BATCH_FIELDS),
           tuple(getattr(layout, name) for name in LAYER_FIELDS), constants, options)
    return cached(_LAYER_FLOORS, key, lambda: _layer_floor(model, job, layout, calib, options))


_LAYER_FLOORS: dict[tuple[object, ...], LayerFloor] = new_cache()


def _layer_floor(model: Model, job: Job, layout: Layout, calib: Calibration,
                 options: CostOptions) -> LayerFloor:
    precision = linear_precision(job, options)
    dense = pass_times(layer_work(model, job, layout, False, options), calib, precision, "none")
    moe = (pass_times(layer_work(model, job, layout, True, options), calib, precision, "none")
           if model.moe is not None else None)
    moe_layers = num_moe_layers(model)
    return LayerFloor(dense.forward_s + dense.backward_s,
                      0.0 if moe is None else moe.forward_s + moe.backward_s,
                      model.num_layers - moe_layers, moe_layers)


def balanced_floor_s(layers: LayerFloor, layout: Layout, global_batch_size: int) -> float:
    """A bound below ``compute_floor``'s ``work_s`` of ``layout`` (whose per-layer fields
    ``layers`` was computed at) that needs no stage shapes: ``m`` times the *mean* pipeline
    rank's forward + backward (every layer once, over ``pp`` ranks; the output layer and the
    bubble left out), which is at most the slowest rank's. Lowered by one part in 10^9 so that
    float rounding of the two sums never puts it above the floor it bounds."""
    m = max(1, layout.num_microbatches(global_batch_size))
    mean_s = (layers.dense_s * layers.dense_layers + layers.moe_s * layers.moe_layers) / layout.pp
    return m * mean_s * (1.0 - 1e-9)


def with_exposure(model: Model, cluster: Cluster, job: Job, layout: Layout, floor: StepFloor,
                  calib: Calibration, options: CostOptions) -> StepFloor:
    """``floor`` (``compute_floor`` of the same layout) with each stage's least exposed TP, CP
    and EP traffic on the natural placement's group links added; the traffic per stage and
    micro-batch cached without the global batch, as ``compute_floor``'s stages."""
    key = _batch_free_key(model, job, layout, calib, options)
    if key is None:
        exposed = _stage_exposure(model, cluster, job, layout, floor, calib, options)
    else:
        exposed = cached(_EXPOSED, (text_key(cluster), *key), lambda: _stage_exposure(
            model, cluster, job, layout, floor, calib, options))
    return _floor(job, layout, floor.stages, list(exposed), True, floor.attention_forward_s)


def _stage_exposure(model: Model, cluster: Cluster, job: Job, layout: Layout, floor: StepFloor,
                    calib: Calibration, options: CostOptions) -> tuple[float, ...]:
    """Each stage's least exposed TP, CP and EP traffic per micro-batch (``with_exposure``)."""
    links = group_links(cluster, layout, DEFAULT_ORDER, None, None,
                        experts=model.moe is not None, dims=FLOOR_GROUPS)
    tokens = tokens_per_gpu(job, layout)
    tp_layer_s = tp_per_layer(model, layout, links, calib, tokens).exposed_s
    if options.tp_comm_overlap and layout.sequence_parallel:
        tp_layer_s *= max(1.0 - calib.tp_overlap_efficiency, 1.0 / layout.tp)
    imbalance = options.routed_imbalance if model.moe is not None else 1.0
    ep_layer_s = ep_per_layer(model, layout, links, calib, tokens, imbalance,
                              options.moe_dispatcher).exposed_s
    if options.ep_comm_overlap or layout.pipeline_schedule in ("dualpipe", "dualpipev"):
        ep_layer_s *= max(0.0, 1.0 - calib.overlap_efficiency)
    cp_s: dict[int, float] = {}
    if layout.cp > 1:
        for shape, _ in floor.stages:
            if shape.layers not in cp_s:
                cp_s[shape.layers] = cp_exposed_s(model, layout, links, calib, tokens, shape,
                                                  floor.attention_forward_s,
                                                  options.cp_comm_overlap)
    return tuple(tp_layer_s * shape.layers + ep_layer_s * shape.moe_layers
                 + cp_s.get(shape.layers, 0.0) for shape, _ in floor.stages)


def _floor(job: Job, layout: Layout, stages: Stages, exposed: list[float], with_links: bool,
           attention_s: float) -> StepFloor:
    """The slowest stage's total over the step and the bubble of the mean stage, each stage's
    exposure split between forward and backward like its compute (``step._bubble``)."""
    m = max(1, layout.num_microbatches(job.global_batch_size))
    slowest = max(t.forward_s + t.backward_s + e for (_, t), e in zip(stages, exposed,
                                                                        strict=True))
    n = len(stages)
    forward = backward = weight = 0.0
    for (_, t), e in zip(stages, exposed, strict=True):
        share = t.forward_s / t.total_s if t.total_s > 0 else 0.5
        forward += (t.forward_s + share * e) / n
        backward += (t.backward_s + (1.0 - share) * e) / n
        weight += t.gemm_s / 3 / n  # no recompute: 3 passes
    bubble = bubble_s(layout.pipeline_schedule, layout.pp, layout.vpp, forward, backward, weight)
    return StepFloor(m * slowest, bubble, with_links, stages, attention_s)


def least_zero_exposed_s(est: Estimate, calib: Calibration) -> float:
    """The least exposed ZeRO-2/3 per-micro-batch traffic of ``est``'s degrees, micro-batch and
    SP setting under any interleaving and at least its recomputation: each gather and
    reduce-scatter hides behind compute at most the fitted ``zero_overlap_efficiency`` of
    itself (``step._overlapped``, whatever the window), interleaving changes no message, and
    recomputation only adds gathers; the ledger's ZeRO rows hold the dense group's share of
    that traffic over the step (``step._record_zero``)."""
    efficiency = calib.zero_overlap_efficiency
    traffic_s = sum(c.time_s for c in est.collectives if c.dimension == Part.ZERO)
    return max(0.0, 1.0 - efficiency) * traffic_s
