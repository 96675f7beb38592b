"""Hand-built plans for the launch tests: a Candidate with plausible numbers and a rank map.

The rank map is built the way torchrun numbers ranks (node by node, local ranks in ascending GPU
order); ``logical_of_rank`` says which grid point each torchrun rank holds (identity = torchrun's
default order), so tests can exercise both the natural and a remapped placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from placer.mesh import MeshGrid, parse_order
from placer.spec import (
    Candidate,
    Cluster,
    CollectiveCost,
    Job,
    Layout,
    MemoryBreakdown,
    Model,
    Plan,
    RankEntry,
    StepBreakdown,
)
from placer.spec.presets import cluster_preset, model_preset

JOB = Job(name="launch-test", seq_len=4096, global_batch_size=64)


def small_cluster(nodes: int, gpus_per_node: int, *, excluded: Sequence[tuple[int, int]] = (),
                  hostnames: list[str] | None = None, socket_ifname: str | None = None,
                  gpu: str = "H100-SXM-80GB", kind: str = "infiniband") -> Cluster:
    """``nodes`` x ``gpus_per_node`` NVSwitch nodes with one NIC per GPU (rail-optimized)."""
    return Cluster.model_validate({
        "name": f"test-{nodes}x{gpus_per_node}",
        "node_types": [{
            "name": "box",
            "gpu": gpu,
            "gpus_per_node": gpus_per_node,
            "fabric": {"kind": "nvswitch", "nvlink_bandwidth_bytes_per_s": 450e9,
                       "nvlink_domain_size": gpus_per_node, "nvls": True,
                       "pcie_bandwidth_bytes_per_s": 64e9},
            "nics": [{"name": f"mlx5_{i}", "rate_gbps": 400, "gpus": [i]}
                     for i in range(gpus_per_node)],
        }],
        "pools": [{"node_type": "box", "count": nodes, "hostnames": hostnames}],
        "excluded_gpus": [{"node": n, "gpu": g} for n, g in excluded],
        "network": {"kind": kind, "rail_optimized": True},
        "socket_ifname": socket_ifname,
    })


def mixed_cluster() -> Cluster:
    """One DGX A100 node and one DGX H100 node (two node types, different NICs and GPUs)."""
    a100, h100 = cluster_preset("dgx-a100"), cluster_preset("dgx-h100")
    return Cluster.model_validate({
        "name": "mixed",
        "node_types": [a100.node_types[0].model_dump(), h100.node_types[0].model_dump()],
        "pools": [{"node_type": "dgx-a100", "count": 1, "hostnames": ["a100-node01"]},
                  {"node_type": "dgx-h100", "count": 1, "hostnames": ["h100-node01"]}],
        "network": {"kind": "infiniband", "rail_optimized": True},
        "socket_ifname": "=ib0",
    })


def rank_map(cluster: Cluster, layout: Layout, order: Sequence[str],
             logical_of_rank: Sequence[int] | None = None,
             gpus_of_node: dict[int, Sequence[int]] | None = None) -> list[RankEntry]:
    """torchrun's rank numbering over the used GPUs; rank r holds grid point logical_of_rank[r].

    ``gpus_of_node`` picks the used GPUs per cluster node (default: every healthy GPU, filling
    nodes in order until the layout's GPU count is reached).
    """
    grid = MeshGrid(layout, parse_order(order))
    if gpus_of_node is None:
        gpus_of_node, left = {}, layout.num_gpus
        for node in range(cluster.num_nodes):
            take = list(cluster.healthy_gpus(node))[:left]
            if take:
                gpus_of_node[node] = take
            left -= len(take)
    logical = list(logical_of_rank) if logical_of_rank is not None else list(range(grid.size))
    entries, rank = [], 0
    for node in sorted(gpus_of_node):
        for local, gpu in enumerate(sorted(gpus_of_node[node])):
            entries.append(RankEntry(rank=rank, node=node, local_rank=local, gpu=gpu,
                                     coords=grid.coords(logical[rank])))
            rank += 1
    assert rank == layout.num_gpus
    return entries


def candidate(model: Model, cluster: Cluster, job: Job, layout: Layout,
              order: Sequence[str] = ("tp", "cp", "dp", "pp"),
              entries: list[RankEntry] | None = None) -> Candidate:
    """A candidate with self-consistent, plausible estimate numbers (6*N*tokens FLOPs at 45%)."""
    gpu = cluster.node_types[0].gpu
    params = 12 * model.num_layers * model.hidden_size ** 2
    flops = 6.0 * params * job.tokens_per_step
    compute_s = flops / (layout.num_gpus * gpu.bf16_flops * 0.45)
    parts = {"compute_s": compute_s, "recompute_s": compute_s / 3 if layout.recompute != "none"
             else 0.0, "tp_exposed_s": 0.02 * compute_s, "cp_exposed_s": 0.0,
             "ep_exposed_s": 0.0, "pp_bubble_s": 0.0, "pp_p2p_s": 0.0,
             "dp_exposed_s": 0.03 * compute_s, "zero_exposed_s": 0.0, "optimizer_s": 0.01}
    step_s = sum(parts.values())
    per_gpu = flops / step_s / layout.num_gpus
    memory = dict(weights_bytes=2 * params // layout.num_gpus, gradients_bytes=10**9,
                  optimizer_bytes=2 * 10**9, activations_bytes=8 * 10**9, logits_bytes=10**9,
                  moe_buffers_bytes=0, framework_bytes=3 * 10**9, fragmentation_bytes=10**9)
    total = sum(memory.values())
    return Candidate(
        layout=layout,
        mesh_order=list(order),
        step_time_s=step_s,
        tokens_per_s=job.tokens_per_step / step_s,
        tflops_per_gpu=per_gpu / 1e12,
        hardware_tflops_per_gpu=per_gpu / 1e12,
        mfu=per_gpu / gpu.bf16_flops,
        hfu=per_gpu / gpu.bf16_flops,
        peak_memory_bytes=total,
        fits=True,
        breakdown=StepBreakdown(**parts),
        memory=MemoryBreakdown(**memory, total_bytes=total, capacity_bytes=gpu.capacity_bytes,
                               worst_stage=0),
        collectives=[
            CollectiveCost(dimension="tp", collective="all_reduce", message_bytes=2**24,
                           calls_per_step=4 * model.num_layers, group_size=layout.tp,
                           algorithm="nvls", link_class="nvlink",
                           bus_bandwidth_bytes_per_s=4.8e11, time_s=0.01, exposed_s=0.01),
            CollectiveCost(dimension="dp", collective="reduce_scatter", message_bytes=2**28,
                           calls_per_step=1, group_size=layout.dp, algorithm="ring",
                           link_class="network", bus_bandwidth_bytes_per_s=4.6e10,
                           time_s=0.05, exposed_s=0.01),
        ],
        links={"tp": "nvlink", "dp": "network"},
        rank_map=entries if entries is not None else rank_map(cluster, layout, order),
        why=["hand-built for the launch tests"],
    )


def plan(model: Model, cluster: Cluster, candidates: list[Candidate], job: Job = JOB) -> Plan:
    return Plan(placer_version="0.1.0", model=model, cluster=cluster, job=job,
                num_gpus=candidates[0].layout.num_gpus, candidates=candidates)


def plan_2x2_tp_intra() -> Plan:
    """2 nodes x 2 GPUs, llama3-8b, tp=2 inside each node, dp=2 across: the natural order."""
    model, cluster = model_preset("llama3-8b"), small_cluster(2, 2)
    layout = Layout(tp=2, dp=2, zero_stage=1, sequence_parallel=True, recompute="selective")
    return plan(model, cluster, [candidate(model, cluster, JOB, layout)])


# 2 nodes x 4 GPUs, tp=2 cp=2 dp=2: node 0 holds grid points 0,1,4,5 and node 1 holds 2,3,6,7,
# so each cp group spans both nodes and each dp group stays on one node (not torchrun's order).
REMAPPED_2X4 = [0, 1, 4, 5, 2, 3, 6, 7]


def plan_2x4_moe_remapped() -> Plan:
    """mixtral-8x7b on 2x4: tp=2 cp=2 dp=2 ep=2, placed with a non-default rank permutation."""
    model, cluster = model_preset("mixtral-8x7b"), small_cluster(2, 4, socket_ifname="=eth0")
    layout = Layout(tp=2, cp=2, dp=2, ep=2, zero_stage=1, sequence_parallel=True)
    entries = rank_map(cluster, layout, ("tp", "cp", "dp", "pp"), REMAPPED_2X4)
    return plan(model, cluster, [candidate(model, cluster, JOB, layout, entries=entries)])


def plan_excluded_gpu() -> Plan:
    """2 nodes x 2 GPUs with GPU 0 of node 1 failed: 3 ranks (2 + 1), dp=3 over gpus 0,1 | 1."""
    model = model_preset("llama3-8b")
    cluster = small_cluster(2, 2, excluded=[(1, 0)])
    job = Job(name="launch-test-excluded", seq_len=4096, global_batch_size=48)
    layout = Layout(dp=3, zero_stage=1)
    return plan(model, cluster, [candidate(model, cluster, job, layout)], job=job)


def as_json(p: Plan) -> dict[str, Any]:
    return p.model_dump(mode="json")
