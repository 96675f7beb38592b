"""Step time of one layout and placement: compute, communication and their overlaps composed.

Per micro-batch, a pipeline stage runs its layers' forward, backward and recomputation with
tensor-parallel collectives, MoE all-to-alls, the CP K/V ring not hidden behind attention, and
ZeRO-2/3 traffic not hidden behind compute. The pipeline then takes
``m x (slowest stage) + (p-1)/v x (mean stage)`` (1F1B bubble ``(p-1)/m``, interleaved
``(p-1)/(v m)``), plus stage-boundary sends, the exposed part of the data-parallel gradient
reduction and parameter gather (bucketed; the last bucket cannot hide), and the optimizer step.
The breakdown's parts add up to the step time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from placer.cost import collectives as coll
from placer.cost.collectives import CollectiveTime, GroupLink
from placer.cost.compute import (
    ACTIVATION_BYTES,
    ATTENTION_BACKWARD_RATIO,
    ZERO_TIMES,
    LayerWork,
    PassTimes,
    attention_forward_s,
    gemm_times,
    layer_work,
    linear_precision,
    logits_work,
    model_flops_per_step,
    optimizer_step_time,
    pass_times,
    recompute_flops_per_step,
    tokens_per_gpu,
)
from placer.cost.dispatch import dispatch_message, rdma_message
from placer.cost.groups import GroupLinks, group_links, representative_groups
from placer.cost.memo import (
    BATCH_FIELDS,
    DP_FIELDS,
    cached,
    constants_key,
    layout_fields,
    new_cache,
    remember,
    text_key,
)
from placer.cost.memory import deepspeed_engine_memory, memory_estimate
from placer.cost.options import DEFAULT_OPTIONS, CostOptions
from placer.cost.params import StageShape, stage_params, stage_shapes
from placer.cost.pipeline import bubble_s
from placer.cost.profile import Calibration, bounding_node_type, calibration_for
from placer.cost.recompute import offloaded_layers, recomputed_fraction
from placer.cost.stack_options import job_options
from placer.dims import DEFAULT_ORDER, PART_GROUP, PART_ORDER, PRICED_GROUPS, Group, Part
from placer.errors import InputError
from placer.spec.cluster import Cluster
from placer.spec.job import Job, Optimizer
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.profile import LinkProfile
from placer.spec.results import CollectiveCost, Estimate, StepBreakdown

# Megatron-Core DDP bucket: max(40M, 1M x dp*cp size) parameters (distributed_data_parallel.py).
DP_BUCKET_MIN_PARAMS = 40_000_000
DP_BUCKET_PARAMS_PER_RANK = 1_000_000


@dataclass(frozen=True)
class _Call:
    """One collective of one size on one group: ``calls`` of it per layer and micro-batch
    (per-layer traffic), ``last_bucket`` the share of it in the last gradient bucket
    (once-per-step traffic)."""

    collective: str
    group: Group
    link: GroupLink
    message_bytes: float
    one: CollectiveTime
    calls: float = 1.0
    last_bucket: float = 1.0

    @property
    def time_s(self) -> float:
        return self.one.time_s


@dataclass(frozen=True)
class LayerCalls:
    """How often a per-layer collective runs per micro-batch: ``forward`` times in each forward
    pass (the recomputed forward of full recomputation repeats them) and ``backward`` times in
    the backward. The cost model counts with it and the replay splits its counts back with it."""

    forward: int
    backward: int

    def per_microbatch(self, layout: Layout) -> int:
        return self.forward * layout.forward_passes + self.backward

    def first_forward(self, calls: int, layout: Layout) -> int:
        """Of ``calls`` counted per layer and micro-batch, those of the first forward pass."""
        return calls * self.forward // self.per_microbatch(layout)


LAYER_CALLS: dict[Part, LayerCalls] = {
    # Megatron: one all-reduce (or all-gather + reduce-scatter with SP) after attention and one
    # after the MLP, forward; their conjugates in the backward (Shoeybi et al. 2019, figure 4).
    Part.TP: LayerCalls(forward=2, backward=2),
    # MoE: dispatch and combine all-to-alls forward, and again for the gradients backward.
    Part.EP: LayerCalls(forward=2, backward=2),
    # CP ring step: K/V out in the forward; K/V and dK/dV in the backward (per ring step).
    Part.CP: LayerCalls(forward=1, backward=2),
}


@dataclass
class _Ledger:
    """Collective costs as they are added up, one row per (part, group, collective): the dense
    gradient reduction (dp_cp) and the expert one (edp) stay apart."""

    rows: dict[tuple[Part, Group, str], CollectiveCost] = field(default_factory=dict)

    def add(self, part: Part, call: _Call, calls: float, exposed_s: float) -> None:
        one, link = call.one, call.link
        if one.time_s <= 0 or calls <= 0:
            return
        key = (part, call.group, call.collective)
        previous = self.rows.get(key)
        time_s = one.time_s * calls + (previous.time_s if previous else 0.0)
        exposed = exposed_s + (previous.exposed_s if previous else 0.0)
        count = round(calls) + (previous.calls_per_step if previous else 0)
        self.rows[key] = CollectiveCost(
            dimension=part, group=call.group, collective=call.collective,
            message_bytes=int(call.message_bytes), calls_per_step=count, group_size=link.size,
            algorithm=one.algorithm, link_class=link.link_class,  # type: ignore[arg-type]
            bus_bandwidth_bytes_per_s=one.bus_bandwidth_bytes_per_s, time_s=time_s,
            exposed_s=exposed)

    def sorted_rows(self) -> list[CollectiveCost]:
        part = {d: i for i, d in enumerate(PART_ORDER)}
        group = {g: i for i, g in enumerate(PRICED_GROUPS)}
        return [self.rows[k] for k in
                sorted(self.rows, key=lambda k: (part[k[0]], group[k[1]], k[2]))]


@dataclass(frozen=True)
class _StageTime:
    """One micro-batch on one stage, split the way the breakdown reports it."""

    compute: PassTimes
    tp_s: float
    cp_s: float
    ep_s: float
    zero_s: float

    @property
    def total_s(self) -> float:
        return self.compute.total_s + self.tp_s + self.cp_s + self.ep_s + self.zero_s


def estimate(model: Model, cluster: Cluster, job: Job, layout: Layout,
             order: Sequence[str] = DEFAULT_ORDER, placement: Sequence[int] | None = None,
             profile: LinkProfile | None = None,
             options: CostOptions | None = None,
             groups: Mapping[str, list[int]] | None = None) -> Estimate:
    """Predicted step time, throughput, memory and breakdown of one layout and placement.

    ``order`` is the mesh order (placer.mesh, innermost first); ``placement`` maps logical index
    i to GPU slot ``placement[i]`` (None: slot i); ``groups`` names the group priced per
    dimension (default: the one holding index 0; see ``groups.worst_placed_groups``). The
    layout is assumed valid for the job (``placer.spec.validate_layout``).
    ``options`` says how the framework runs it (flash attention, overlaps, MoE imbalance);
    None: the job's runtime settings on its stack (``stack_options.job_options``).
    """
    if options is None:
        options = job_options(job)
    if layout.num_gpus > cluster.num_gpus:
        raise InputError("layout", layout.compact(),
                         f"needs {layout.num_gpus} GPUs but the cluster has {cluster.num_gpus}")
    if placement is not None and len(placement) != layout.num_gpus:
        raise InputError("placement", len(placement),
                         f"must map all {layout.num_gpus} logical ranks to GPU slots")
    calib = calibration_for(cluster, profile)
    links = group_links(cluster, layout, tuple(order), placement, groups,
                        experts=model.moe is not None)
    replicas = None
    if layout.zero_replicas > 1 and Group.DP_CP in links:
        links, replicas = _hsdp_links(cluster, layout, tuple(order), placement, links,
                                      groups.get(Group.DP_CP) if groups else None)
    return estimate_with(model, cluster, job, layout, tuple(order), links, calib, options,
                         replicas)


def _hsdp_links(cluster: Cluster, layout: Layout, order: tuple[str, ...],
                placement: Sequence[int] | None, links: GroupLinks,
                members: list[int] | None) -> tuple[GroupLinks, GroupLink]:
    """HSDP: the ZeRO shard group (the innermost ``dp_shard`` ranks of dp x cp, torchtitan's
    ``dp_shard`` mesh axis inside ``dp_replicate``) replaces dp x cp, and the replica group
    (every ``dp_shard``-th rank) all-reduces each shard's gradients once per step."""
    from placer.topology import topology_of

    if members is None:
        members = representative_groups(layout, order, experts=False)[Group.DP_CP]
    ordered = sorted(members)
    shard = ordered[:layout.zero_group]
    replica = ordered[::layout.zero_group]
    topo = topology_of(cluster)

    def link(group: list[int]) -> GroupLink:
        return topo.group_link(group if placement is None else [placement[i] for i in group],
                               concurrent="all")

    return {**links, Group.DP_CP: link(shard)}, link(replica)


def estimate_with(model: Model, cluster: Cluster, job: Job, layout: Layout,
                  order: tuple[str, ...], links: GroupLinks, calib: Calibration,
                  options: CostOptions = DEFAULT_OPTIONS,
                  replicas: GroupLink | None = None) -> Estimate:
    """``estimate`` with the group links and hardware constants already resolved; with HSDP
    ``links[DP_CP]`` is the shard group and ``replicas`` the replica group (``_hsdp_links``).

    A layout's micro-batch (``_microbatch``) depends neither on the global batch nor on data
    parallelism, and its data-parallel traffic (``_dp_traffic``) not on the global batch: with
    constants from ``calibration_for`` both are cached under value keys
    (placer.cost.memo), so a search of the same model at another global batch, or on more nodes
    with the same group links, costs only the per-step assembly below again. With a caller's
    own constants (a fit's) nothing is cached."""
    calib_key = constants_key(calib)
    key: tuple[object, ...] | None = None
    if calib_key is not None:
        key = (text_key(model), text_key(job, BATCH_FIELDS), layout_fields(layout, DP_FIELDS),
               calib_key, options, links.get(Group.TP), links.get(Group.CP),
               links.get(Group.EP),
               _host_bytes_per_s(cluster) if layout.offload_layers else None,
               # DeepSpeed's wrapper (below) resolves the job and options per ZeRO stage
               layout.zero_stage if options.deepspeed_engine else None)
    if options.deepspeed_engine:  # DeepSpeed's optimizer wrapper for this layout, gradients
        job, options = deepspeed_engine_memory(job, layout, options)  # in the dtype it reduces
    ledger = _Ledger()
    m = max(1, layout.num_microbatches(job.global_batch_size))

    def costed() -> _MicroBatch:
        return _microbatch(model, cluster, job, layout, links, calib, options)

    micro = costed() if key is None else cached(_MICROBATCHES, key, costed)
    dp_key = (None if key is None else
              (key, tuple(getattr(layout, name) for name in DP_FIELDS),
               links.get(Group.DP_CP), links.get(Group.EDP), replicas))

    def traffic() -> _DpTraffic:
        return _dp_traffic(model, layout, job, links, calib, micro, options, replicas)

    dp = traffic() if dp_key is None else cached(_DP_TRAFFIC, dp_key, traffic)
    shapes, tokens = micro.shapes, micro.tokens
    tp_layer, ep_layer = micro.tp_layer, micro.ep_layer
    stage_times = []
    by_shape: dict[tuple[int, int, bool, bool], _StageTime] = {}  # a deep pipeline repeats shapes
    for shape in shapes:
        kind = shape.kind
        if kind not in by_shape:
            part = micro.stages[kind]
            zero_s = _zero_per_microbatch(layout, calib, shape, part.compute, m,
                                          dp.zero[kind])
            by_shape[kind] = replace(part, zero_s=zero_s)
        stage_times.append(by_shape[kind])
    worst = max(stage_times, key=lambda s: s.total_s)
    worst_shape = shapes[stage_times.index(worst)]

    # Ledger entries for the per-micro-batch collectives (worst stage, whole step).
    tp_layer.record(ledger, m * worst_shape.layers, m * worst.tp_s)
    ep_layer.record(ledger, m * worst_shape.moe_layers, m * worst.ep_s)
    if layout.cp > 1 and Group.CP in links:
        _record_cp(ledger, model, layout, links, calib, tokens, m * worst_shape.layers,
                   m * worst.cp_s)
    _record_zero(ledger, layout, dp.zero[worst_shape.kind], m, m * worst.zero_s)

    bubble = _bubble(layout, stage_times)
    p2p = _pp_p2p(model, layout, links, calib, tokens, m, ledger, options.p2p_overlap)
    for call, exposed_s in dp.rows:
        ledger.add(Part.DP, call, 1, exposed_s)
    dp_exposed = dp.exposed_s
    params = stage_params(model, layout, worst_shape)
    # the optimizer steps its shard only
    sharded = layout.effective_zero_stage >= 1 or options.deepspeed_bf16_optimizer
    dense_shard = layout.zero_group if sharded else 1
    expert_shard = layout.expert_zero_group if sharded else 1
    optimizer_s = optimizer_step_time(params.dense / dense_shard + params.expert / expert_shard,
                                      calib)

    breakdown = StepBreakdown(
        compute_s=m * (worst.compute.forward_s + worst.compute.backward_s),
        recompute_s=m * worst.compute.recompute_s,
        tp_exposed_s=m * worst.tp_s, cp_exposed_s=m * worst.cp_s, ep_exposed_s=m * worst.ep_s,
        pp_bubble_s=bubble, pp_p2p_s=p2p, dp_exposed_s=dp_exposed,
        zero_exposed_s=m * worst.zero_s, optimizer_s=optimizer_s)
    step = sum(breakdown.model_dump().values())
    memory = memory_estimate(model, cluster, job, layout, options, calib.profile)
    gpus = layout.num_gpus
    model_flops = model_flops_per_step(model, job)
    hardware_flops = model_flops + recompute_flops_per_step(model, job, layout)
    peak = calib.peak_flops(job.precision)  # MFU of the job's precision (FP8 runs: the FP8 peak)
    return Estimate(
        layout=layout, mesh_order=list(order), step_time_s=step,
        tokens_per_s=job.tokens_per_step / step,
        tflops_per_gpu=model_flops / (step * gpus) / 1e12,
        hardware_tflops_per_gpu=hardware_flops / (step * gpus) / 1e12,
        mfu=model_flops / (step * gpus * peak), hfu=hardware_flops / (step * gpus * peak),
        peak_memory_bytes=memory.total_bytes, fits=memory.total_bytes <= memory.capacity_bytes,
        breakdown=breakdown, memory=memory, collectives=ledger.sorted_rows(),
        links={str(part): links[group].link_class  # type: ignore[misc]
               for part, group in PART_GROUP.items() if part != Part.ZERO and group in links})


_MICROBATCHES: dict[tuple[object, ...], _MicroBatch] = new_cache()
_DP_TRAFFIC: dict[tuple[object, ...], _DpTraffic] = new_cache()
_HOSTS: dict[int, tuple[Cluster, float]] = new_cache()


def _host_bytes_per_s(cluster: Cluster) -> float:
    """Host-link bandwidth of the memory-bounding node type (``_offload_stall``), per cluster."""
    hit = _HOSTS.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit[1]
    bandwidth = bounding_node_type(cluster).fabric.host_bytes_per_s
    remember(_HOSTS, id(cluster), (cluster, bandwidth))
    return bandwidth


@dataclass(frozen=True)
class _MicroBatch:
    """One micro-batch of a layout, costed on each kind of stage: compute and the exposed TP,
    CP and EP traffic (``_StageTime`` with ``zero_s`` 0), and the per-layer collectives. None of
    it depends on the micro-batch count or on the data-parallel degree."""

    shapes: list[StageShape]
    tokens: float
    tp_layer: _PerLayer
    ep_layer: _PerLayer
    stages: dict[tuple[int, int, bool, bool], _StageTime]


def _microbatch(model: Model, cluster: Cluster, job: Job, layout: Layout, links: GroupLinks,
                calib: Calibration, options: CostOptions) -> _MicroBatch:
    """The per-micro-batch half of ``estimate_with``: each stage kind's passes and the TP, CP
    and EP traffic its compute does not hide."""
    imb = options.routed_imbalance if model.moe is not None else 1.0
    shapes = stage_shapes(model, layout)
    tokens = tokens_per_gpu(job, layout)
    precision = linear_precision(job, options)  # NVFP4 GEMMs under an NVFP4 recipe
    dense_work = layer_work(model, job, layout, False, options)
    modules = layout.recompute_modules
    dense = pass_times(dense_work, calib, precision, layout.recompute, modules=modules)
    moe_work = layer_work(model, job, layout, True, options) if model.moe is not None else None
    moe = (pass_times(moe_work, calib, precision, layout.recompute, modules=modules)
           if moe_work is not None else ZERO_TIMES)
    # FP8 recipes keep the output layer in BF16: Megatron-Core's output_layer is a plain
    # tensor_parallel.ColumnParallelLinear, not a Transformer Engine module, so fp8_autocast
    # leaves it alone; torchtitan's float8 options name "output" as the module to filter.
    head = pass_times(logits_work(model, job, layout), calib, "bf16", layout.recompute,
                      is_layer=False)

    tp_layer = tp_per_layer(model, layout, links, calib, tokens)
    # Eager modules (torchtitan) project q, k, v and w1, w3 separately (_tp_overlapped_layer_s).
    summed = not options.fused_kernels
    tp_dense = _tp_overlapped_layer_s(tp_layer, dense_work, False, layout, calib, precision,
                                      summed)
    tp_moe = (_tp_overlapped_layer_s(tp_layer, moe_work, True, layout, calib, precision, summed)
              if moe_work is not None else 0.0)
    ep_layer = ep_per_layer(model, layout, links, calib, tokens, imb, options.moe_dispatcher)
    # The other micro-batch's compute hides the dispatch (Megatron
    # --overlap-moe-expert-parallel-comm; DualPipe's overlapped forward-backward chunks).
    ep_hidden = options.ep_comm_overlap or layout.pipeline_schedule in ("dualpipe", "dualpipev")
    attn_fwd = attention_forward_s(dense_work, calib)
    stages: dict[tuple[int, int, bool, bool], _StageTime] = {}  # a deep pipeline repeats shapes
    for shape in shapes:
        key = shape.kind
        if key in stages:
            continue
        compute = dense.scaled(shape.layers - shape.moe_layers) + moe.scaled(shape.moe_layers)
        redone = recomputed_fraction(layout, model.num_layers, shape.stage)
        if layout.recompute == "full" and redone < 1.0:  # block method: N layers per stage
            compute = replace(compute, recompute_s=compute.recompute_s * redone)
        compute = compute + _offload_stall(layout, shape, dense_work, moe_work, dense, moe,
                                           cluster)
        if shape.last:
            compute = compute + head
        cp_s = cp_exposed_s(model, layout, links, calib, tokens, shape, attn_fwd,
                            options.cp_comm_overlap)
        tp_s = tp_layer.exposed_s * shape.layers
        if options.tp_comm_overlap and tp_s > 0 and layout.sequence_parallel:
            tp_s = (tp_dense * (shape.layers - shape.moe_layers)
                    + tp_moe * shape.moe_layers)
        ep_s = ep_layer.exposed_s * shape.moe_layers
        if ep_hidden and ep_s > 0:
            ep_s = _overlapped(ep_s, compute.total_s, calib.overlap_efficiency)
        stages[key] = _StageTime(compute=compute, tp_s=tp_s, cp_s=cp_s, ep_s=ep_s, zero_s=0.0)
    return _MicroBatch(shapes, tokens, tp_layer, ep_layer, stages)


@dataclass(frozen=True)
class _DpTraffic:
    """A layout's data-parallel traffic, which the micro-batch count does not change: ZeRO-2/3
    traffic per micro-batch of each stage kind, and the once-per-step gradient reduction and
    parameter gather (exposed time, and the ledger rows with their exposed shares)."""

    zero: dict[tuple[int, int, bool, bool], _ZeroTraffic | None]
    exposed_s: float
    rows: tuple[tuple[_Call, float], ...]


def _dp_traffic(model: Model, layout: Layout, job: Job, links: GroupLinks, calib: Calibration,
                micro: _MicroBatch, options: CostOptions,
                replicas: GroupLink | None) -> _DpTraffic:
    zero = {}
    for shape in micro.shapes:
        if shape.kind not in zero:
            zero[shape.kind] = (None if layout.zero3_per_step else
                                _zero_traffic(model, layout, job, links, calib, shape, options))
    dp_overlap = options.dp_comm_overlap and (layout.pp == 1 or options.dp_overlap_under_pp)
    # DeepSpeed's BF16_Optimizer shards its fp32 state over DP at ZeRO stage 0 too (options.py)
    state_sharded = options.deepspeed_bf16_optimizer
    stage_times = [micro.stages[shape.kind] for shape in micro.shapes]
    exposed_s, rows = _dp_exposed(model, layout, job, links, calib, micro.shapes, stage_times,
                                  dp_overlap, replicas, options.param_gather_overlap,
                                  state_sharded)
    return _DpTraffic(zero, exposed_s, rows)


def _offload_stall(layout: Layout, shape: StageShape, dense_work: LayerWork,
                   moe_work: LayerWork | None, dense: PassTimes, moe: PassTimes,
                   cluster: Cluster) -> PassTimes:
    """Activation offload transfers the layer compute does not hide (charged to compute).

    An offloaded layer's saved activations go to the host (PCIe, or NVLink-C2C on Grace
    systems: ``IntraNodeFabric.host_bytes_per_s``) while the next layer runs
    its forward, and come back while the layer after it in the backward runs (Megatron
    --cpu-offloading-num-layers); the copy that outlasts that layer stalls the stream.
    """
    layers = offloaded_layers(layout, shape.layers)
    if not layers:
        return ZERO_TIMES
    bandwidth = bounding_node_type(cluster).fabric.host_bytes_per_s
    kinds = [(dense_work, dense, shape.layers - shape.moe_layers)]
    if moe_work is not None:
        kinds.append((moe_work, moe, shape.moe_layers))
    forward = backward = 0.0
    for work, times, count in kinds:
        share = layers * count / max(1, shape.layers)
        copy_s = work.elementwise_bytes / bandwidth
        forward += share * max(0.0, copy_s - times.forward_s)
        backward += share * max(0.0, copy_s - times.backward_s)
    return PassTimes(forward, backward, 0.0)


def _bubble(layout: Layout, stage_times: list[_StageTime]) -> float:
    """Pipeline bubble of the schedule (placer.cost.pipeline) from the mean stage's forward,
    backward and weight-gradient times per micro-batch.

    A stage's exposed communication is split between forward and backward like its compute.
    The weight-gradient GEMMs cost what the forward GEMMs do (same FLOPs), so ``W`` is the GEMM
    time over its three passes (four with full recomputation, which reruns the forward GEMMs).
    With 1F1B and interleaving this is ``(p-1)/v`` times the mean stage.
    """
    if layout.pp <= 1:
        return 0.0
    n = len(stage_times)
    forward = backward = weight = 0.0
    passes = 3 + (1 if layout.recompute == "full" else 0)
    for t in stage_times:
        compute = t.compute.total_s
        share = t.compute.forward_s / compute if compute > 0 else 0.5
        forward += share * t.total_s / n
        backward += (1.0 - share) * t.total_s / n
        weight += t.compute.gemm_s / passes / n
    return bubble_s(layout.pipeline_schedule, layout.pp, layout.vpp, forward, backward, weight)


@dataclass(frozen=True)
class _PerLayer:
    """Collectives one layer issues per micro-batch, and the part on the critical path."""

    part: Part
    items: tuple[_Call, ...]
    exposed_s: float

    def record(self, ledger: _Ledger, layers_times_microbatches: float, exposed_s: float) -> None:
        """Add this layer kind's collectives for a whole step, sharing out ``exposed_s``."""
        total_s = sum(c.time_s * c.calls for c in self.items)
        for c in self.items:
            share = c.time_s * c.calls / total_s if total_s > 0 else 0.0
            ledger.add(self.part, c, c.calls * layers_times_microbatches, exposed_s * share)


NO_LAYER = _PerLayer(Part.TP, (), 0.0)


def tp_per_layer(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
                 tokens: float) -> _PerLayer:
    """TP: two all-reduces forward and two backward per layer (AG + RS with SP), exposed."""
    if layout.tp <= 1 or Group.TP not in links:
        return NO_LAYER
    link = links[Group.TP]
    nbytes = tokens * model.hidden_size * ACTIVATION_BYTES
    per_pass = LAYER_CALLS[Part.TP].per_microbatch(layout)
    if layout.sequence_parallel:
        ag = coll.all_gather(link, nbytes, calib)
        rs = coll.reduce_scatter(link, nbytes, calib)
        items = (_Call("all_gather", Group.TP, link, nbytes, ag, per_pass),
                 _Call("reduce_scatter", Group.TP, link, nbytes, rs, per_pass))
        exposed = per_pass * (ag.time_s + rs.time_s)
    else:
        ar = coll.all_reduce(link, nbytes, calib)
        items = (_Call("all_reduce", Group.TP, link, nbytes, ar, per_pass),)
        exposed = per_pass * ar.time_s
    return _PerLayer(Part.TP, items, exposed)


def _tp_overlapped_layer_s(tp_layer: _PerLayer, work: LayerWork, moe_layer: bool,
                           layout: Layout, calib: Calibration, precision: str,
                           summed_input_grads: bool = False) -> float:
    """Exposed TP time of one layer when each collective is pipelined with its GEMM.

    Megatron's --tp-comm-overlap (Transformer Engine userbuffers) and torchtitan's async TP
    split the sequence-parallel all-gather into tp chunks behind the column-parallel GEMM that
    consumes it (QKV, first MLP linear), and the reduce-scatter behind the row-parallel GEMM
    that produces it (attention output, second MLP linear); in the backward the same
    collectives run behind that linear's dgrad and wgrad GEMMs (twice its forward time). Each
    hides at most the fitted overlap efficiency and never its first chunk (1/tp of it).
    In an MoE layer the MLP side's windows are the router and experts' first GEMMs, and the
    experts' second GEMMs (with the shared experts').

    ``summed_input_grads``: the column-parallel side is several modules reading one gathered
    input (torchtitan's wq, wk, wv and w1, w3 behind one PrepareModuleInput all-gather,
    pytorch/torchtitan@9dec370 torchtitan/parallelisms/parallelize_llama.py apply_tp, models/
    llama/model.py), so the backward reduce-scatters the sum of their input gradients. Async
    TP's Inductor pass fuses a reduce-scatter only into the one matmul that produces its input
    (torch/_inductor/fx_passes/micro_pipeline_tp.py fuse_matmul_reduce_scatter: the input must
    be an mm, or a reshape of one), so those two reduce-scatters run exposed.
    """
    calls = {c.collective: c for c in tp_layer.items}
    if "all_gather" not in calls or "reduce_scatter" not in calls:
        return tp_layer.exposed_s
    times = gemm_times(work.gemms, work.gemm_shapes, calib, precision, work.gemm_groups,
                       work.gemm_one_kernel)
    qkv, out = times[0], times[1]
    if moe_layer:  # router, experts' first, experts' second, [shared first, shared second]
        mlp_in = times[2] + times[3] + sum(times[5:6])
        mlp_out = times[4] + sum(times[6:7])
    else:
        mlp_in, mlp_out = times[2], times[3]
    ag, rs = calls["all_gather"].time_s, calls["reduce_scatter"].time_s

    def hide(comm_s: float, window_s: float) -> float:
        return max(_overlapped(comm_s, window_s, calib.tp_overlap_efficiency),
                   comm_s / layout.tp)

    forward = hide(ag, qkv) + hide(ag, mlp_in) + hide(rs, out) + hide(rs, mlp_out)
    if summed_input_grads:
        backward = hide(ag, 2 * out) + hide(ag, 2 * mlp_out) + 2 * rs
    else:
        backward = (hide(ag, 2 * out) + hide(ag, 2 * mlp_out) + hide(rs, 2 * qkv)
                    + hide(rs, 2 * mlp_in))
    return forward * layout.forward_passes + backward


def ep_per_layer(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
                 tokens: float, imbalance: float, dispatcher: str = "alltoall") -> _PerLayer:
    """EP: dispatch and combine per MoE layer, forward and backward (and redo), with the
    dispatcher's own traffic (placer.cost.dispatch)."""
    if model.moe is None or layout.ep <= 1 or Group.EP not in links:
        return _PerLayer(Part.EP, (), 0.0)
    link = links[Group.EP]
    moe = model.moe
    dispatch, combine, nbytes = dispatch_message(dispatcher, tokens / layout.tp,
                                                 model.hidden_size, moe.top_k, moe.num_experts,
                                                 layout.ep, imbalance)
    calls = LAYER_CALLS[Part.EP].per_microbatch(layout)
    if dispatcher == "flex":  # DeepEP / HybridEP kernels, not NCCL's all-to-all
        remote = rdma_message(tokens / layout.tp, model.hidden_size, moe.top_k, moe.num_experts,
                              link.num_nodes, imbalance)
        one = coll.deepep_all_to_all(link, nbytes, calib, remote)
        return _PerLayer(Part.EP, (_Call(dispatch, Group.EP, link, nbytes, one, calls),),
                         calls * one.time_s)
    if dispatch == combine:
        one = _collective(dispatch, link, nbytes, calib)
        return _PerLayer(Part.EP, (_Call(dispatch, Group.EP, link, nbytes, one, calls),),
                         calls * one.time_s)
    first = _collective(dispatch, link, nbytes, calib)
    second = _collective(combine, link, nbytes, calib)
    return _PerLayer(Part.EP, (_Call(dispatch, Group.EP, link, nbytes, first, calls / 2),
                               _Call(combine, Group.EP, link, nbytes, second, calls / 2)),
                     calls / 2 * (first.time_s + second.time_s))


def _collective(name: str, link: GroupLink, nbytes: float, calib: Calibration) -> CollectiveTime:
    return {"all_to_all": coll.all_to_all, "all_gather": coll.all_gather,
            "reduce_scatter": coll.reduce_scatter}[name](link, nbytes, calib)


def _cp_step(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
             tokens: float) -> _Call:
    """One ring step of CP: this rank's K and V chunk sent to its neighbour."""
    link = links[Group.CP]
    kv_local = layout.kv_heads_per_gpu(model.kv_heads)
    nbytes = 2 * tokens * kv_local * model.attention_head_dim * ACTIVATION_BYTES
    return _Call("send_recv", Group.CP, link, nbytes, coll.send_recv(link, nbytes, calib))


def cp_exposed_s(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
                 tokens: float, shape: StageShape, attn_fwd: float, overlap: bool = True) -> float:
    """CP ring attention: each of cp-1 K/V exchanges hides behind one block of attention.

    ``attn_fwd`` is a layer's core-attention forward time on this GPU; the ring splits it into
    cp blocks (load-balanced causal blocks are equal), one per exchange. Without ``overlap``
    every exchange waits.
    """
    if layout.cp <= 1 or Group.CP not in links:
        return 0.0
    one = _cp_step(model, layout, links, calib, tokens).one
    steps = layout.cp - 1
    if not overlap:
        return shape.layers * steps * one.time_s * (1 + 2 + (layout.forward_passes - 1))
    eff = calib.overlap_efficiency
    fwd = steps * _overlapped(one.time_s, attn_fwd / layout.cp, eff)
    # Backward sends K, V and receives dK, dV per step, behind the backward attention.
    bwd = steps * _overlapped(2 * one.time_s, ATTENTION_BACKWARD_RATIO * attn_fwd / layout.cp,
                              eff)
    redo = fwd if layout.forward_passes > 1 else 0.0
    return shape.layers * (fwd + bwd + redo)


def _record_cp(ledger: _Ledger, model: Model, layout: Layout, links: GroupLinks,
               calib: Calibration, tokens: float, layer_microbatches: float,
               exposed_s: float) -> None:
    step = _cp_step(model, layout, links, calib, tokens)
    per_layer = (layout.cp - 1) * LAYER_CALLS[Part.CP].per_microbatch(layout)
    ledger.add(Part.CP, step, per_layer * layer_microbatches, exposed_s)


@dataclass(frozen=True)
class _ZeroTraffic:
    """ZeRO-2/3 traffic of one stage per micro-batch pass (dense and expert groups together)."""

    gather_s: float  # one all-gather of the stage's parameters (ZeRO-3)
    scatter_s: float  # one reduce-scatter of its gradients (ZeRO-2/3)
    gathers: int  # all-gathers per micro-batch
    gather: _Call  # the dense group's, for the ledger
    scatter: _Call


def _zero_traffic(model: Model, layout: Layout, job: Job, links: GroupLinks, calib: Calibration,
                  shape: StageShape, options: CostOptions = DEFAULT_OPTIONS
                  ) -> _ZeroTraffic | None:
    """ZeRO-3 parameter gathers and ZeRO-2/3 gradient reduce-scatters of a stage.

    ZeRO-3 gathers a layer's parameters for the forward and again for the backward. With full
    recomputation DeepSpeed (per-submodule fetches, ``zero3_max_live_params``) fetches once more
    for the recomputed forward, which its pre-forward hooks trigger; FSDP does not: the
    checkpointed block recomputes inside its unit's backward, after FSDP's pre-backward hook has
    already gathered the unit (torch.distributed.fsdp: unshard in the pre-backward hook), so the
    recomputation reuses the backward's gather.

    FSDP gathers and reduce-scatters each unit's flat buffer in one NCCL ring collective, which
    runs a channel per NIC and so crosses nodes at the node's aggregate network bandwidth, like
    every other ring collective here (nccl-tests: 8 HDR NICs give 192 GB/s busbw,
    docs/sources.md 4). DeepSpeed's per-submodule fetches (``zero3_max_live_params``) are
    priced at each GPU's own NIC share: that is what the DeepSpeed ZeRO-3 runs of Narayanan et
    al. 2021 (Table 2) measure, and the cross-node gather cost that motivated ZeRO++'s
    hierarchical partitioning (Wang et al. 2023, arXiv:2306.10209, section 3).
    """
    if layout.zero_stage < 2 or Group.DP_CP not in links:
        return None
    params = stage_params(model, layout, shape)
    link, opt = links[Group.DP_CP], job.optimizer
    gather_bytes = params.dense * opt.param_bytes
    scatter_bytes = params.dense * opt.grad_bytes
    nics = options.zero3_max_live_params is None
    gather = coll.all_gather(link, gather_bytes, calib, aggregate_nics=nics)
    scatter = coll.reduce_scatter(link, scatter_bytes, calib, aggregate_nics=nics)
    gather_s = gather.time_s if layout.zero_stage >= 3 else 0.0
    scatter_s = scatter.time_s
    if params.expert and Group.EDP in links:
        elink = links[Group.EDP]
        if layout.zero_stage >= 3:
            gather_s += coll.all_gather(elink, params.expert * opt.param_bytes, calib,
                                        aggregate_nics=nics).time_s
        scatter_s += coll.reduce_scatter(elink, params.expert * opt.grad_bytes, calib,
                                         aggregate_nics=nics).time_s
    gathers = 0
    if layout.zero_stage >= 3:
        # Each forward, and the backward; without resharding after the forward (FSDP2
        # reshard_after_forward=False) the forward's gather serves the backward too.
        redo = layout.forward_passes - 1 if options.zero3_max_live_params is not None else 0
        gathers = 2 + redo if layout.reshards_after_forward else 1
    return _ZeroTraffic(gather_s, scatter_s, gathers,
                        _Call("all_gather", Group.DP_CP, link, gather_bytes, gather),
                        _Call("reduce_scatter", Group.DP_CP, link, scatter_bytes, scatter))


def _zero_per_microbatch(layout: Layout, calib: Calibration, shape: StageShape,
                         compute: PassTimes, microbatches: int,
                         traffic: _ZeroTraffic | None) -> float:
    """Exposed ZeRO-2/3 ``traffic`` per micro-batch (the mean over the step's
    ``microbatches``); None: none per micro-batch (ZeRO-3 under pipelining gathers once per
    step, see _dp_exposed).

    ZeRO-3: the forward gathers each layer while the previous one computes, so only what
    exceeds the forward compute is exposed, plus the first layer's gather; the backward (and
    recomputation) gathers again and reduce-scatters gradients, hiding behind its compute
    except the last layer's reduce-scatter.

    ZeRO-2 has no gathers: each unit's (layer's) reduce-scatter runs on its own stream after
    the unit's backward, and the compute stream waits for it only when the next unit issues
    its own (torch 2.13 FSDP2, _fsdp_param_group.py post_backward: the oldest pending
    reduce-scatter is waited for once reduce_scatter_max_input_buffers, default 1, are in
    flight; finalize_backward waits for the rest). So a layer's reduce-scatter hides behind the
    next layer's backward, and the last layer of each model chunk's behind what the rank runs
    next: the following forward chunk of the (interleaved) 1F1B schedule, 1/v of the stage's
    forward, or the next micro-batch's forward. Only the step's last reduce-scatter waits in
    full (the last micro-batch's last layer).
    """
    if traffic is None:
        return 0.0
    layers = max(1, shape.layers)
    g, rs = traffic.gather_s, traffic.scatter_s
    eff = calib.zero_overlap_efficiency
    backward_s = compute.backward_s + compute.recompute_s
    if not traffic.gathers:
        m, chunks = max(1, microbatches), min(layout.vpp, layers)
        inner = (layers - chunks) / layers * _overlapped(rs, backward_s, eff)
        chunk_ends = chunks * _overlapped(rs / layers,
                                          (backward_s / layers + compute.forward_s / chunks), eff)
        step_end = rs / layers - _overlapped(rs / layers, backward_s / layers
                                             + compute.forward_s / chunks, eff)
        return inner + chunk_ends + step_end / m
    fwd = _overlapped(g, compute.forward_s, eff) + g / layers
    later = (traffic.gathers - 1) * g + rs
    bwd = _overlapped(later, backward_s, eff) + rs / layers
    return fwd + bwd


def _overlapped(comm_s: float, window_s: float, efficiency: float) -> float:
    """Exposed part of ``comm_s`` run alongside ``window_s`` of compute.

    What exceeds the window is exposed, and overlapping never hides more than ``efficiency``
    of the traffic, the fitted overlap efficiency of its mechanism (collectives and kernels
    share SMs and HBM; profile.Calibration).
    """
    return max(comm_s - window_s, comm_s * (1.0 - efficiency), 0.0)


def _record_zero(ledger: _Ledger, layout: Layout, traffic: _ZeroTraffic | None, m: int,
                 exposed_s: float) -> None:
    """Ledger rows for ZeRO-2/3 ``traffic`` (the worst stage's) over a whole step, sharing out
    the exposed time."""
    if traffic is None:
        return
    per_microbatch = traffic.gathers * traffic.gather_s + traffic.scatter_s
    share = exposed_s / (per_microbatch * m) if per_microbatch > 0 else 0.0
    if traffic.gathers:
        ledger.add(Part.ZERO, traffic.gather, traffic.gathers * m,
                   share * traffic.gathers * traffic.gather_s * m)
    ledger.add(Part.ZERO, traffic.scatter, m, share * traffic.scatter_s * m)


def _pp_p2p(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
            tokens: float, m: int, ledger: _Ledger, overlap: bool = True) -> float:
    """Stage-boundary sends on the critical path: activations forward, gradients back.

    Each TP rank sends 1/t of the boundary activations (Megatron's scatter-gather, or sequence
    parallelism). Filling and draining the pipeline always waits for 2(p-1) transfers. In steady
    state the non-interleaved 1F1B schedule sends and receives in blocking pairs between its
    steps (two per micro-batch); the interleaved schedule overlaps them with the next chunk's
    compute (Megatron's --overlap-p2p-communication, on by default) but crosses v boundaries;
    so do the multi-chunk schedules of torch.distributed.pipelining (ZB, ZB-V, DualPipeV), whose
    sends are asynchronous. Without ``overlap`` every send waits.
    """
    if layout.pp <= 1 or Group.PP not in links:
        return 0.0
    link = links[Group.PP]
    nbytes = tokens * model.hidden_size * ACTIVATION_BYTES / layout.tp
    one = coll.send_recv(link, nbytes, calib)
    sends = 2 * m * layout.vpp + 2 * (layout.pp - 1)
    blocking = layout.pipeline_schedule in ("1f1b", "gpipe") or not overlap
    on_path = 2 * (layout.pp - 1) + (2 * m * layout.vpp if blocking else 0)
    exposed = on_path * one.time_s
    ledger.add(Part.PP, _Call("send_recv", Group.PP, link, nbytes, one), sends, exposed)
    return exposed


def _dp_exposed(model: Model, layout: Layout, job: Job, links: GroupLinks, calib: Calibration,
                shapes: list[StageShape], stage_times: list[_StageTime], overlap: bool,
                replicas: GroupLink | None = None, gather_overlap: bool = True,
                state_sharded: bool = False) -> tuple[float, tuple[tuple[_Call, float], ...]]:
    """Gradient reduction (and the distributed optimizer's parameter gather) not hidden, and
    the worst stage's collectives with their shares of it (the ledger's DP rows).

    Gradients are reduced in buckets while the last micro-batch's backward runs; stage s ends
    its backward about s backward-passes before stage 0, which finishes last. Only what exceeds
    that window is exposed, and never less than the last bucket. With ZeRO-1/2 the updated
    parameters are gathered back during the next step's first forward, likewise bucketed.
    Without overlap (``overlap=False``) all of it is exposed; without ``gather_overlap``
    (Megatron without --overlap-param-gather) the parameter gather is. With HSDP the shards'
    gradients are also all-reduced over the ``replicas`` group (1/dp_shard of them each),
    bucketed with the reduce-scatter. ``state_sharded`` (DeepSpeed's BF16_Optimizer) all-gathers
    the updated parameters after the step at ZeRO stage 0 too (bf16_optimizer.py step,
    update_lp_params: all_gather_dp_groups), beside its gradient all-reduce.
    """
    zero = layout.effective_zero_stage
    dense_group, expert_group = layout.dp_cp, layout.expert_dp
    # ZeRO-3 under pipelining gathers and reduce-scatters once per step, like ZeRO-1.
    per_step_zero3 = layout.zero3_per_step
    # ZeRO-3 without pipelining moves its traffic per micro-batch (_zero_per_microbatch); only
    # an HSDP replica all-reduce is left for the end of the step.
    per_microbatch_zero3 = zero >= 3 and not per_step_zero3
    if (per_microbatch_zero3 and replicas is None) or (dense_group <= 1 and expert_group <= 1):
        return 0.0, ()
    if Group.DP_CP not in links:
        return 0.0, ()
    opt = job.optimizer
    bucket = max(DP_BUCKET_MIN_PARAMS, DP_BUCKET_PARAMS_PER_RANK * dense_group)
    mean_bwd = sum(t.compute.backward_s + t.compute.recompute_s for t in stage_times) / len(
        stage_times)
    worst = 0.0
    rows: list[_Call] = []
    memo: dict[tuple[float, float], list[_Call]] = {}
    # Along the stages of one shape the window only grows, so what is exposed only shrinks:
    # the first stage of each shape is its worst, and the first worst stage is reported.
    seen: set[tuple[int, int, bool, bool]] = set()
    for shape, times in zip(shapes, stage_times, strict=True):
        if shape.kind in seen:
            continue
        seen.add(shape.kind)
        params = stage_params(model, layout, shape)
        key = (params.dense, params.expert)
        if key not in memo:
            memo[key] = ([] if per_microbatch_zero3 else
                         _dp_parts(params.dense, params.expert, links, calib, opt, zero, bucket,
                                   per_step_zero3, state_sharded))
            if replicas is not None and zero >= 1:
                grad_bytes = params.dense * opt.grad_bytes / layout.zero_group
                one = coll.all_reduce(replicas, grad_bytes, calib)
                memo[key].append(_Call("all_reduce", Group.DP_CP, replicas, grad_bytes, one,
                                       last_bucket=min(1.0, bucket / max(params.dense, 1.0))))
        parts = memo[key]
        grads = [p for p in parts if p.collective != "all_gather"]
        gathers = [p for p in parts if p.collective == "all_gather"]
        if overlap:
            window = (times.compute.backward_s + times.compute.recompute_s
                      + shape.stage * mean_bwd)
            exposed = _bucketed_exposed(grads, window, calib)
            exposed += (_bucketed_exposed(gathers, times.compute.forward_s, calib)
                        if gather_overlap else sum(p.time_s for p in gathers))
        else:
            exposed = sum(p.time_s for p in parts)
        if exposed > worst or not rows:
            worst, rows = exposed, parts
    total = sum(p.time_s for p in rows)
    return worst, tuple((call, worst * (call.time_s / total if total > 0 else 0.0))
                        for call in rows)


def _dp_parts(dense: float, expert: float, links: GroupLinks, calib: Calibration,
              opt: Optimizer, zero: int, bucket: float, per_step_zero3: bool,
              state_sharded: bool = False) -> list[_Call]:
    """The once-per-step collectives of one stage, dense (dp_cp) then expert (edp) gradients.

    Ring collectives at the node's aggregate network bandwidth; ZeRO-3 under pipelining is
    FSDP's (DeepSpeed refuses ZeRO-3 with its pipeline engine), as in ``_zero_traffic``."""
    parts: list[_Call] = []
    for share, group in ((dense, Group.DP_CP), (expert, Group.EDP)):
        if share <= 0 or group not in links or links[group].size <= 1:
            continue
        link = links[group]
        grad_bytes = share * opt.grad_bytes
        fraction = min(1.0, bucket / share)
        if zero == 0:
            one = coll.all_reduce(link, grad_bytes, calib)
            parts.append(_Call("all_reduce", group, link, grad_bytes, one, last_bucket=fraction))
        elif zero == 1 or per_step_zero3:
            one = coll.reduce_scatter(link, grad_bytes, calib)
            parts.append(_Call("reduce_scatter", group, link, grad_bytes, one,
                               last_bucket=fraction))
        if zero >= 1 or state_sharded:
            param_bytes = share * opt.param_bytes
            one = coll.all_gather(link, param_bytes, calib)
            parts.append(_Call("all_gather", group, link, param_bytes, one, last_bucket=fraction))
    return parts


def _bucketed_exposed(parts: list[_Call], window_s: float, calib: Calibration) -> float:
    """Exposed time of bucketed traffic overlapping a compute window of ``window_s``."""
    if not parts:
        return 0.0
    total = sum(p.time_s for p in parts)
    last_bucket = sum(p.time_s * p.last_bucket for p in parts)
    return max(last_bucket, _overlapped(total, window_s, calib.overlap_efficiency))


__all__ = ["estimate", "estimate_with"]
