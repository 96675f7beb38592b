"""Layer-to-stage split on clusters that mix GPU types: slower stages get fewer layers.

A pipeline runs at the pace of its slowest stage, and a stage is as fast as the slowest GPU in
it (its TP/CP/DP peers wait for each other). The split minimises ``max_s layers_s / speed_s``
over integers (CP-SAT; the proportional rounding is the hint), where a stage's speed is its GPUs'
dense peak for the job's precision; each stage holds a multiple of ``vpp`` layers (whole virtual
stages) and fits its GPUs' memory.

Memory per layer is read off the cost model's even-split breakdown: weights, gradients,
optimizer state and activations scale with the layers a stage holds; the framework, logits,
MoE buffers and fragmentation allowance do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from placer.cost import memory_estimate
from placer.mesh import MeshGrid
from placer.solver.cpsat import deterministic_solver
from placer.solver.placement import Placement
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, pipeline_stage_layers
from placer.spec.model import Model
from placer.topology import ClusterTopology

SPLIT_TIME_LIMIT_S = 1.0
"""Deterministic-time budget of the split model: pp integers, solved at once in practice."""

SPEED_SCALE = 1_000_000
"""Integer resolution of the per-layer time 1/speed in the split model."""


def split_layers(num_layers: int, vpp: int, speeds: Sequence[float],
                 max_layers: Sequence[int]) -> list[int] | None:
    """Layers per stage minimising the slowest stage's time; None if memory forbids any split."""
    pp = len(speeds)
    chunks_total, rest = divmod(num_layers, vpp)
    if rest or any(m < vpp for m in max_layers) or sum(m // vpp for m in max_layers) < chunks_total:
        return None
    fastest = max(speeds)
    cost = [round(SPEED_SCALE * fastest / s) for s in speeds]
    from ortools.sat.python import cp_model  # loaded only where a model is solved

    model = cp_model.CpModel()
    chunks = [model.new_int_var(1, max_layers[s] // vpp, f"k{s}") for s in range(pp)]
    model.add(sum(chunks) == chunks_total)
    slowest = model.new_int_var(0, num_layers * max(cost), "slowest")
    for s in range(pp):
        model.add(slowest >= chunks[s] * (vpp * cost[s]))
    model.minimize(slowest)
    share = [chunks_total * sp / sum(speeds) for sp in speeds]
    for s in range(pp):
        model.add_hint(chunks[s], max(1, min(max_layers[s] // vpp, round(share[s]))))
    solver = deterministic_solver(SPLIT_TIME_LIMIT_S)
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [vpp * solver.value(k) for k in chunks]


def _stage_gpus(layout: Layout, placement: Placement, topology: ClusterTopology,
                cluster: Cluster) -> list[list[tuple[float, int]]]:
    """(peak FLOP/s, capacity bytes) of every GPU of each pipeline stage."""
    grid = MeshGrid(layout, placement.order)
    stride, pp = grid.strides["pp"], layout.pp
    out: list[list[tuple[float, int]]] = [[] for _ in range(pp)]
    for logical in range(layout.num_gpus):
        slot = placement.slots[logical] if placement.slots is not None else logical
        gpu = cluster.node_type_of(topology.node_of(slot)).gpu
        out[(logical // stride) % pp].append((gpu.bf16_flops, gpu.capacity_bytes))
    return out


def used_peak_flops(layout: Layout, placement: Placement, topology: ClusterTopology,
                    cluster: Cluster, precision: str) -> float | None:
    """Sum of the dense peaks (the job's precision) of the GPUs the ranks are placed on, MFU's
    denominator, on a cluster of several node types; None on one type, where the cost model's
    GPU count times that type's peak is the sum already."""
    if not cluster.mixed_node_types:
        return None
    return sum(cluster.node_type_of(topology.node_of(
        placement.slots[logical] if placement.slots is not None else logical)).gpu.peak_flops(
        precision) for logical in range(layout.num_gpus))


class TypeSplit(NamedTuple):
    """An uneven split by GPU speed and what it changes in the step estimate."""

    layers: list[int]
    notes: list[str]
    pace: float
    """The slowest stage's compute time against the even split's. The step estimate prices
    every GPU as the slowest type, so with the even split the slowest stage sets the pace; the
    parts of the step that run at a stage's pace (compute, recompute, bubble) scale by this."""


def split_for_types(model: Model, cluster: Cluster, job: Job, layout: Layout,
                    placement: Placement, topology: ClusterTopology) -> TypeSplit | None:
    """The uneven split when the stages run on different GPU types; None otherwise."""
    used_types = {p.node_type for p in cluster.pools}
    if len(used_types) < 2 or layout.pp == 1:
        return None
    stages = _stage_gpus(layout, placement, topology, cluster)
    precision_peak = {t.gpu.bf16_flops: t.gpu.peak_flops(job.precision)
                      for t in cluster.node_types}
    speeds = [min(precision_peak[f] for f, _ in gpus) for gpus in stages]
    if len(set(speeds)) == 1:
        return None
    memory = memory_estimate(model, cluster, job, layout)
    default = (pipeline_stage_layers(model.num_layers, layout.pp, layout.vpp)
               or [model.num_layers // layout.pp] * layout.pp)
    scaling = (memory.weights_bytes + memory.gradients_bytes + memory.optimizer_bytes
               + memory.activations_bytes)
    fixed = memory.total_bytes - scaling
    per_layer = scaling / max(default)  # the memory estimate is the fullest stage's
    capacities = [int(min(c for _, c in gpus) * (1.0 - job.memory_headroom)) for gpus in stages]
    max_layers = [max(0, int((cap - fixed) // per_layer)) for cap in capacities]
    split = split_layers(model.num_layers, layout.vpp, speeds, max_layers)
    if split is None or split == default:
        return None
    even = max(n / s for n, s in zip(default, speeds, strict=True))
    uneven = max(n / s for n, s in zip(split, speeds, strict=True))
    note = (f"stages: layers {split} by GPU speed; the slowest stage's compute drops "
            f"{1 - uneven / even:.0%} against the even split (the step estimate's compute, "
            "recompute and bubble are scaled by that; MFU is of the peaks of the GPUs used)")
    return TypeSplit(split, [note], uneven / even)
