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
from dataclasses import dataclass, field

from placer.cost import collectives as coll
from placer.cost.collectives import CollectiveTime, GroupLink
from placer.cost.compute import (
    ACTIVATION_BYTES,
    ATTENTION_BACKWARD_RATIO,
    ZERO_TIMES,
    PassTimes,
    attention_forward_s,
    layer_work,
    logits_work,
    model_flops_per_step,
    optimizer_step_time,
    pass_times,
    recompute_flops_per_step,
    tokens_per_gpu,
)
from placer.cost.groups import GroupLinks, group_links
from placer.cost.memory import memory_estimate
from placer.cost.options import DEFAULT_OPTIONS, CostOptions
from placer.cost.params import StageShape, stage_params, stage_shapes
from placer.cost.profile import Calibration, calibration_for
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
    return estimate_with(model, cluster, job, layout, tuple(order), links, calib, options)


def estimate_with(model: Model, cluster: Cluster, job: Job, layout: Layout,
                  order: tuple[str, ...], links: GroupLinks, calib: Calibration,
                  options: CostOptions = DEFAULT_OPTIONS) -> Estimate:
    """``estimate`` with the group links and hardware constants already resolved."""
    imb = options.moe_load_imbalance if model.moe is not None else 1.0
    ledger = _Ledger()
    m = max(1, layout.num_microbatches(job.global_batch_size))
    shapes = stage_shapes(model, layout)
    tokens = tokens_per_gpu(job, layout)
    precision = job.precision
    dense_work = layer_work(model, job, layout, False, options)
    dense = pass_times(dense_work, calib, precision, layout.recompute)
    moe = (pass_times(layer_work(model, job, layout, True, options), calib, precision,
                      layout.recompute) if model.moe is not None else ZERO_TIMES)
    # FP8 recipes keep the output layer in BF16: Megatron-Core's output_layer is a plain
    # tensor_parallel.ColumnParallelLinear, not a Transformer Engine module, so fp8_autocast
    # leaves it alone; torchtitan's float8 options name "output" as the module to filter.
    head = pass_times(logits_work(model, job, layout), calib, "bf16", layout.recompute,
                      is_layer=False)

    tp_layer = _tp_per_layer(model, layout, links, calib, tokens)
    ep_layer = _ep_per_layer(model, layout, links, calib, tokens, imb)
    attn_fwd = attention_forward_s(dense_work, calib)
    stage_times = []
    by_shape: dict[tuple[int, int, bool, bool], _StageTime] = {}  # a deep pipeline repeats shapes
    for shape in shapes:
        key = shape.kind
        if key not in by_shape:
            compute = dense.scaled(shape.layers - shape.moe_layers) + moe.scaled(shape.moe_layers)
            if shape.last:
                compute = compute + head
            cp_s = _cp_exposed(model, layout, links, calib, tokens, shape, attn_fwd)
            zero_s = _zero_per_microbatch(model, layout, job, links, calib, shape, compute)
            tp_s = tp_layer.exposed_s * shape.layers
            if options.tp_comm_overlap and tp_s > 0:
                # Pipelined with the GEMMs in tp chunks: the first chunk cannot hide.
                tp_s = max(_overlapped(tp_s, compute.gemm_s, calib), tp_s / layout.tp)
            by_shape[key] = _StageTime(compute=compute, tp_s=tp_s, cp_s=cp_s,
                                       ep_s=ep_layer.exposed_s * shape.moe_layers, zero_s=zero_s)
        stage_times.append(by_shape[key])
    worst = max(stage_times, key=lambda s: s.total_s)
    worst_shape = shapes[stage_times.index(worst)]
    mean_stage = sum(s.total_s for s in stage_times) / len(stage_times)

    # Ledger entries for the per-micro-batch collectives (worst stage, whole step).
    tp_layer.record(ledger, m * worst_shape.layers, m * worst.tp_s)
    ep_layer.record(ledger, m * worst_shape.moe_layers, m * worst.ep_s)
    if layout.cp > 1 and Group.CP in links:
        _record_cp(ledger, model, layout, links, calib, tokens, m * worst_shape.layers,
                   m * worst.cp_s)
    _record_zero(ledger, model, layout, job, links, calib, worst_shape, m, m * worst.zero_s)

    bubble = (layout.pp - 1) / layout.vpp * mean_stage if layout.pp > 1 else 0.0
    p2p = _pp_p2p(model, layout, links, calib, tokens, m, ledger)
    dp_exposed = _dp_exposed(model, layout, job, links, calib, shapes, stage_times, ledger,
                             options.dp_comm_overlap)
    params = stage_params(model, layout, worst_shape)
    dense_shard = layout.dp_cp if layout.zero_stage >= 1 else 1
    expert_shard = layout.expert_dp if layout.zero_stage >= 1 else 1
    optimizer_s = optimizer_step_time(params.dense / dense_shard + params.expert / expert_shard,
                                      calib)

    breakdown = StepBreakdown(
        compute_s=m * (worst.compute.forward_s + worst.compute.backward_s),
        recompute_s=m * worst.compute.recompute_s,
        tp_exposed_s=m * worst.tp_s, cp_exposed_s=m * worst.cp_s, ep_exposed_s=m * worst.ep_s,
        pp_bubble_s=bubble, pp_p2p_s=p2p, dp_exposed_s=dp_exposed,
        zero_exposed_s=m * worst.zero_s, optimizer_s=optimizer_s)
    step = sum(breakdown.model_dump().values())
    memory = memory_estimate(model, cluster, job, layout, options)
    gpus = layout.num_gpus
    model_flops = model_flops_per_step(model, job)
    hardware_flops = model_flops + recompute_flops_per_step(model, job, layout)
    peak = calib.peak_flops(precision)  # MFU of the job's precision (FP8 runs: the FP8 peak)
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


def _tp_per_layer(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
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


def _ep_per_layer(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
                  tokens: float, imbalance: float) -> _PerLayer:
    """EP: dispatch and combine all-to-alls per MoE layer, forward and backward (and redo)."""
    if model.moe is None or layout.ep <= 1 or Group.EP not in links:
        return _PerLayer(Part.EP, (), 0.0)
    link = links[Group.EP]
    nbytes = tokens / layout.tp * model.moe.top_k * model.hidden_size * ACTIVATION_BYTES
    nbytes *= imbalance
    one = coll.all_to_all(link, nbytes, calib)
    calls = LAYER_CALLS[Part.EP].per_microbatch(layout)
    return _PerLayer(Part.EP, (_Call("all_to_all", Group.EP, link, nbytes, one, calls),),
                     calls * one.time_s)


def _cp_step(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
             tokens: float) -> _Call:
    """One ring step of CP: this rank's K and V chunk sent to its neighbour."""
    link = links[Group.CP]
    kv_local = layout.kv_heads_per_gpu(model.kv_heads)
    nbytes = 2 * tokens * kv_local * model.attention_head_dim * ACTIVATION_BYTES
    return _Call("send_recv", Group.CP, link, nbytes, coll.send_recv(link, nbytes, calib))


def _cp_exposed(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
                tokens: float, shape: StageShape, attn_fwd: float) -> float:
    """CP ring attention: each of cp-1 K/V exchanges hides behind one block of attention.

    ``attn_fwd`` is a layer's core-attention forward time on this GPU; the ring splits it into
    cp blocks (load-balanced causal blocks are equal), one per exchange.
    """
    if layout.cp <= 1 or Group.CP not in links:
        return 0.0
    one = _cp_step(model, layout, links, calib, tokens).one
    steps = layout.cp - 1
    fwd = steps * _overlapped(one.time_s, attn_fwd / layout.cp, calib)
    # Backward sends K, V and receives dK, dV per step, behind the backward attention.
    bwd = steps * _overlapped(2 * one.time_s, ATTENTION_BACKWARD_RATIO * attn_fwd / layout.cp,
                              calib)
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
                  shape: StageShape) -> _ZeroTraffic | None:
    """ZeRO-3 parameter gathers and ZeRO-2/3 gradient reduce-scatters of a stage.

    ZeRO-3 gathers a layer's parameters for the forward, again for the backward and, with full
    recomputation, for the recomputed forward (DeepSpeed releases them after every forward;
    FSDP2 reuses the backward gather, so this is an upper bound). Each rank's shard is small at
    scale, and these collectives are modelled at the GPU's own network share, not the node's
    aggregate: the cross-node traffic that motivates hierarchical sharding (ZeRO++ hpZ, Wang et
    al. 2023, arXiv:2306.10209, section 3; PyTorch HSDP).
    """
    if layout.zero_stage < 2 or Group.DP_CP not in links:
        return None
    params = stage_params(model, layout, shape)
    link, opt = links[Group.DP_CP], job.optimizer
    gather_bytes = params.dense * opt.param_bytes
    scatter_bytes = params.dense * opt.grad_bytes
    gather = coll.all_gather(link, gather_bytes, calib, aggregate_nics=False)
    scatter = coll.reduce_scatter(link, scatter_bytes, calib, aggregate_nics=False)
    gather_s = gather.time_s if layout.zero_stage >= 3 else 0.0
    scatter_s = scatter.time_s
    if params.expert and Group.EDP in links:
        elink = links[Group.EDP]
        if layout.zero_stage >= 3:
            gather_s += coll.all_gather(elink, params.expert * opt.param_bytes, calib,
                                        aggregate_nics=False).time_s
        scatter_s += coll.reduce_scatter(elink, params.expert * opt.grad_bytes, calib,
                                         aggregate_nics=False).time_s
    gathers = 0
    if layout.zero_stage >= 3:
        gathers = layout.forward_passes + 1  # each forward, and the backward
    return _ZeroTraffic(gather_s, scatter_s, gathers,
                        _Call("all_gather", Group.DP_CP, link, gather_bytes, gather),
                        _Call("reduce_scatter", Group.DP_CP, link, scatter_bytes, scatter))


def _zero_per_microbatch(model: Model, layout: Layout, job: Job, links: GroupLinks,
                         calib: Calibration, shape: StageShape, compute: PassTimes) -> float:
    """Exposed ZeRO-2/3 traffic per micro-batch: gathers prefetched one layer ahead.

    The forward gathers each layer while the previous one computes, so only what exceeds the
    forward compute is exposed, plus the first layer's gather; the backward (and recomputation)
    gathers again and reduce-scatters gradients, hiding behind its compute except the last
    layer's reduce-scatter.
    """
    if layout.zero3_per_step:
        return 0.0  # gathered once per step under pipelining (see _dp_exposed)
    traffic = _zero_traffic(model, layout, job, links, calib, shape)
    if traffic is None:
        return 0.0
    layers = max(1, shape.layers)
    g, rs = traffic.gather_s, traffic.scatter_s
    fwd = _overlapped(g, compute.forward_s, calib) + g / layers if traffic.gathers else 0.0
    later = max(0, traffic.gathers - 1) * g + rs
    bwd = _overlapped(later, compute.backward_s + compute.recompute_s, calib) + rs / layers
    return fwd + bwd


def _overlapped(comm_s: float, window_s: float, calib: Calibration) -> float:
    """Exposed part of ``comm_s`` run alongside ``window_s`` of compute.

    What exceeds the window is exposed, and overlapping never hides more than the fitted
    overlap efficiency of the traffic (collectives and kernels share SMs and HBM).
    """
    return max(comm_s - window_s, comm_s * (1.0 - calib.overlap_efficiency), 0.0)


def _record_zero(ledger: _Ledger, model: Model, layout: Layout, job: Job, links: GroupLinks,
                 calib: Calibration, shape: StageShape, m: int, exposed_s: float) -> None:
    """Ledger rows for ZeRO-2/3 over a whole step, sharing out the exposed time."""
    traffic = _zero_traffic(model, layout, job, links, calib, shape)
    if traffic is None or layout.zero3_per_step:
        return
    per_microbatch = traffic.gathers * traffic.gather_s + traffic.scatter_s
    share = exposed_s / (per_microbatch * m) if per_microbatch > 0 else 0.0
    if traffic.gathers:
        ledger.add(Part.ZERO, traffic.gather, traffic.gathers * m,
                   share * traffic.gathers * traffic.gather_s * m)
    ledger.add(Part.ZERO, traffic.scatter, m, share * traffic.scatter_s * m)


def _pp_p2p(model: Model, layout: Layout, links: GroupLinks, calib: Calibration,
            tokens: float, m: int, ledger: _Ledger) -> float:
    """Stage-boundary sends on the critical path: activations forward, gradients back.

    Each TP rank sends 1/t of the boundary activations (Megatron's scatter-gather, or sequence
    parallelism). Filling and draining the pipeline always waits for 2(p-1) transfers. In steady
    state the non-interleaved 1F1B schedule sends and receives in blocking pairs between its
    steps (two per micro-batch); the interleaved schedule overlaps them with the next chunk's
    compute (Megatron's --overlap-p2p-communication, on by default) but crosses v boundaries.
    """
    if layout.pp <= 1 or Group.PP not in links:
        return 0.0
    link = links[Group.PP]
    nbytes = tokens * model.hidden_size * ACTIVATION_BYTES / layout.tp
    one = coll.send_recv(link, nbytes, calib)
    sends = 2 * m * layout.vpp + 2 * (layout.pp - 1)
    on_path = 2 * (layout.pp - 1) + (2 * m if layout.vpp == 1 else 0)
    exposed = on_path * one.time_s
    ledger.add(Part.PP, _Call("send_recv", Group.PP, link, nbytes, one), sends, exposed)
    return exposed


def _dp_exposed(model: Model, layout: Layout, job: Job, links: GroupLinks, calib: Calibration,
                shapes: list[StageShape], stage_times: list[_StageTime], ledger: _Ledger,
                overlap: bool) -> float:
    """Gradient reduction (and the distributed optimizer's parameter gather) not hidden.

    Gradients are reduced in buckets while the last micro-batch's backward runs; stage s ends
    its backward about s backward-passes before stage 0, which finishes last. Only what exceeds
    that window is exposed, and never less than the last bucket. With ZeRO-1/2 the updated
    parameters are gathered back during the next step's first forward, likewise bucketed.
    Without overlap (``overlap=False``) all of it is exposed.
    """
    zero = layout.zero_stage
    dense_group, expert_group = layout.dp_cp, layout.expert_dp
    # ZeRO-3 under pipelining gathers and reduce-scatters once per step, like ZeRO-1.
    per_step_zero3 = layout.zero3_per_step
    if (zero >= 3 and not per_step_zero3) or (dense_group <= 1 and expert_group <= 1):
        return 0.0
    if Group.DP_CP not in links:
        return 0.0
    opt = job.optimizer
    bucket = max(DP_BUCKET_MIN_PARAMS, DP_BUCKET_PARAMS_PER_RANK * dense_group)
    mean_bwd = sum(t.compute.backward_s + t.compute.recompute_s for t in stage_times) / len(
        stage_times)
    worst = 0.0
    rows: list[_Call] = []
    nics = not per_step_zero3  # ZeRO-3 shards: each GPU's own NIC share (_zero_traffic)
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
            memo[key] = _dp_parts(params.dense, params.expert, links, calib, opt, zero, bucket,
                                  per_step_zero3, nics)
        parts = memo[key]
        grads = [p for p in parts if p.collective != "all_gather"]
        gathers = [p for p in parts if p.collective == "all_gather"]
        if overlap:
            window = (times.compute.backward_s + times.compute.recompute_s
                      + shape.stage * mean_bwd)
            exposed = _bucketed_exposed(grads, window, calib)
            exposed += _bucketed_exposed(gathers, times.compute.forward_s, calib)
        else:
            exposed = sum(p.time_s for p in parts)
        if exposed > worst or not rows:
            worst, rows = exposed, parts
    total = sum(p.time_s for p in rows)
    for call in rows:
        share = call.time_s / total if total > 0 else 0.0
        ledger.add(Part.DP, call, 1, worst * share)
    return worst


def _dp_parts(dense: float, expert: float, links: GroupLinks, calib: Calibration,
              opt: Optimizer, zero: int, bucket: float, per_step_zero3: bool, nics: bool
              ) -> list[_Call]:
    """The once-per-step collectives of one stage, dense (dp_cp) then expert (edp) gradients."""
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
            one = coll.reduce_scatter(link, grad_bytes, calib, aggregate_nics=nics)
            parts.append(_Call("reduce_scatter", group, link, grad_bytes, one,
                               last_bucket=fraction))
        if zero >= 1:
            param_bytes = share * opt.param_bytes
            one = coll.all_gather(link, param_bytes, calib, aggregate_nics=nics)
            parts.append(_Call("all_gather", group, link, param_bytes, one, last_bucket=fraction))
    return parts


def _bucketed_exposed(parts: list[_Call], window_s: float, calib: Calibration) -> float:
    """Exposed time of bucketed traffic overlapping a compute window of ``window_s``."""
    if not parts:
        return 0.0
    total = sum(p.time_s for p in parts)
    last_bucket = sum(p.time_s * p.last_bucket for p in parts)
    return max(last_bucket, _overlapped(total, window_s, calib))


__all__ = ["estimate", "estimate_with"]
