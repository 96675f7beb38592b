"""Time of one NCCL collective over one process group, from the group's links.

Each collective is ``latency + bytes x factor / bus bandwidth`` with the nccl-tests bus-bandwidth
factors (docs/sources.md 4): all-reduce ``2(n-1)/n``; all-gather, reduce-scatter and all-to-all
``(n-1)/n`` of the *total* buffer; send/recv 1. Bus bandwidth is the link's line rate times the
efficiency NCCL reaches on it (placer/cost/profile.py), or a measured link profile's figure.

All-reduce considers the algorithms NCCL chooses between and reports the fastest:

* ``ring``: every rank sends ``2(n-1)/n`` of the buffer; across nodes the ring's node-crossing
  traffic is bounded by the group's network bandwidth out of its busiest node;
* ``tree`` (multi-node): logarithmic latency ``2((m-1) a_intra + log2(N) a_inter)`` and 0.92 of
  the ring's bandwidth with NCCL's size-dependent correction (src/graph/tuning.cc);
* ``nvls`` (inside an NVLink SHARP domain): switch-side reduction, ~480 GB/s busbw on H100;
* ``hierarchical`` (spanning nodes, several GPUs per node): intra-node reduce-scatter, an
  inter-node all-reduce of 1/m of the buffer per GPU over its own NIC, intra-node all-gather.

The group's links come from the topology (``GroupLink``): per-GPU intra-node bandwidth, per-GPU
and per-node network shares already divided among concurrent groups, and per-hop latencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placer.cost.profile import PCIE_EFFICIENCY, Calibration
from placer.topology import GroupLink

# NCCL's tree all-reduce bandwidth relative to ring ("busBw*.92" in src/graph/tuning.cc) and its
# Simple-protocol correction per power-of-two size from 64 B to 256 MB (treeCorrectionFactor).
TREE_BANDWIDTH_FRACTION = 0.92
TREE_CORRECTION_SIMPLE = (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5,
                          0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9)


@dataclass(frozen=True)
class CollectiveTime:
    """One call: its time, NCCL's likely algorithm and the bus bandwidth that implies."""

    time_s: float
    algorithm: str
    bus_bandwidth_bytes_per_s: float


NO_TIME = CollectiveTime(0.0, "none", 0.0)


def crosses_network(link: GroupLink) -> bool:
    return link.link_class == "network" and link.num_nodes > 1


def _intra_bw(link: GroupLink, calib: Calibration, collective: str) -> float:
    measured = calib.measured("intra", collective)
    if measured is not None:
        return measured.bandwidth_bytes_per_s
    eff = PCIE_EFFICIENCY if link.link_class == "pcie" else calib.intra_efficiency
    return link.intra_bytes_per_s * eff


def _gpu_net_bw(link: GroupLink, calib: Calibration, collective: str) -> float:
    """One GPU's share of the network under the concurrent load.

    A profile measures one GPU per node talking alone; when concurrent groups share its NICs,
    the topology's (smaller) share at the preset efficiency bounds it.
    """
    preset = link.inter_bytes_per_s * calib.network_efficiency
    measured = calib.measured("inter", collective)
    if measured is not None:
        return min(measured.bandwidth_bytes_per_s, preset)
    return preset


def _node_net_bw(link: GroupLink, calib: Calibration, collective: str) -> float:
    """The group's network bandwidth out of its busiest node."""
    per_gpu_raw = link.inter_bytes_per_s
    gpus_worth = link.node_inter_bytes_per_s / per_gpu_raw if per_gpu_raw > 0 else 1.0
    return _gpu_net_bw(link, calib, collective) * gpus_worth


def _latencies(link: GroupLink, calib: Calibration, collective: str) -> tuple[float, float]:
    intra = calib.measured("intra", collective)
    inter = calib.measured("inter", collective)
    return (intra.latency_s if intra is not None else link.intra_latency_s,
            inter.latency_s if inter is not None else link.inter_latency_s)


def _ring_shape(link: GroupLink, calib: Calibration, collective: str,
                aggregate_nics: bool = True) -> tuple[float, float]:
    """(mean latency per ring step, bus bandwidth of the ring's slowest link).

    Across nodes a ring with one channel per NIC moves the group's traffic through all of a
    node's NICs (``aggregate_nics``); otherwise each GPU's traffic stays on its own NIC share.
    """
    a_intra, a_inter = _latencies(link, calib, collective)
    if not crosses_network(link):
        return a_intra, _intra_bw(link, calib, collective)
    n, nodes = link.size, link.num_nodes
    step = (a_intra * (n - nodes) + a_inter * nodes) / n
    if aggregate_nics:
        bw = _node_net_bw(link, calib, collective)
    else:
        bw = _gpu_net_bw(link, calib, collective)
    if link.max_gpus_per_node > 1:
        bw = min(bw, _intra_bw(link, calib, collective))
    return step, bw


def _result(time_s: float, algorithm: str, factor_bytes: float) -> CollectiveTime:
    return CollectiveTime(time_s, algorithm, factor_bytes / time_s if time_s > 0 else 0.0)


def _tree_correction(nbytes: float) -> float:
    index = int(math.log2(max(1.0, nbytes / 64)))
    return TREE_CORRECTION_SIMPLE[min(max(index, 0), len(TREE_CORRECTION_SIMPLE) - 1)]


def all_reduce(link: GroupLink, nbytes: float, calib: Calibration) -> CollectiveTime:
    """All-reduce of an ``nbytes`` buffer: the fastest of the algorithms NCCL would consider."""
    n = link.size
    if n <= 1 or nbytes <= 0:
        return NO_TIME
    factor = 2 * (n - 1) / n
    moved = factor * nbytes
    step, ring_bw = _ring_shape(link, calib, "all_reduce")
    options = [(2 * (n - 1) * step + moved / ring_bw, "ring")]
    a_intra, a_inter = _latencies(link, calib, "all_reduce")
    measured_intra = calib.measured("intra", "all_reduce") is not None
    if not crosses_network(link) and link.nvls and not measured_intra:
        nvls_bw = link.intra_bytes_per_s * calib.nvls_speedup
        options.append((2 * a_intra + moved / nvls_bw, "nvls"))
    if crosses_network(link):
        nodes, m = link.num_nodes, link.max_gpus_per_node
        tree_bw = ring_bw * TREE_BANDWIDTH_FRACTION * _tree_correction(nbytes)
        tree_lat = 2 * ((m - 1) * a_intra + math.ceil(math.log2(nodes)) * a_inter)
        options.append((tree_lat + moved / tree_bw, "tree"))
        if m > 1:
            options.append((_hierarchical(link, nbytes, calib), "hierarchical"))
    time_s, algorithm = min(options)
    return _result(time_s, algorithm, moved)


def _hierarchical(link: GroupLink, nbytes: float, calib: Calibration) -> float:
    """Intra-node reduce-scatter, inter-node all-reduce of 1/m per GPU, intra-node all-gather."""
    m, nodes = link.max_gpus_per_node, link.num_nodes
    a_intra, a_inter = _latencies(link, calib, "all_reduce")
    if link.nvls and calib.measured("intra", "all_reduce") is None:
        intra_bw = link.intra_bytes_per_s * calib.nvls_speedup
    else:
        intra_bw = _intra_bw(link, calib, "reduce_scatter")
    intra = 2 * ((m - 1) * a_intra + (m - 1) / m * nbytes / intra_bw)
    per_gpu = nbytes / m
    inter = 2 * (nodes - 1) * a_inter + (
        2 * (nodes - 1) / nodes * per_gpu / _gpu_net_bw(link, calib, "all_reduce"))
    return intra + inter


def _ring_gather(link: GroupLink, total_bytes: float, calib: Calibration,
                 collective: str, aggregate_nics: bool) -> CollectiveTime:
    n = link.size
    if n <= 1 or total_bytes <= 0:
        return NO_TIME
    moved = (n - 1) / n * total_bytes
    step, bw = _ring_shape(link, calib, collective, aggregate_nics)
    return _result((n - 1) * step + moved / bw, "ring", moved)


def all_gather(link: GroupLink, total_bytes: float, calib: Calibration,
               aggregate_nics: bool = True) -> CollectiveTime:
    """All-gather whose gathered (total) buffer is ``total_bytes`` (nccl-tests' S)."""
    return _ring_gather(link, total_bytes, calib, "all_gather", aggregate_nics)


def reduce_scatter(link: GroupLink, total_bytes: float, calib: Calibration,
                   aggregate_nics: bool = True) -> CollectiveTime:
    """Reduce-scatter of a ``total_bytes`` input buffer (nccl-tests' S)."""
    return _ring_gather(link, total_bytes, calib, "reduce_scatter", aggregate_nics)


def all_to_all(link: GroupLink, rank_bytes: float, calib: Calibration) -> CollectiveTime:
    """All-to-all where each rank sends a ``rank_bytes`` buffer split among all ranks.

    Peers on the same node are reached over NVLink/PCIe and the rest over the GPU's own NIC
    share: all-to-all "cannot aggregate the bandwidth of multiple NICs" (docs/sources.md 4).
    """
    n = link.size
    if n <= 1 or rank_bytes <= 0:
        return NO_TIME
    moved = (n - 1) / n * rank_bytes
    a_intra, a_inter = _latencies(link, calib, "all_to_all")
    if not crosses_network(link):
        time_s = a_intra + moved / _intra_bw(link, calib, "all_to_all")
    else:
        m = link.max_gpus_per_node
        local = (m - 1) / n * rank_bytes / _intra_bw(link, calib, "all_to_all") if m > 1 else 0.0
        remote = (n - m) / n * rank_bytes / _gpu_net_bw(link, calib, "all_to_all")
        time_s = a_inter + max(local, remote)
    return _result(time_s, "pairwise", moved)


# DeepEP's normal (training) kernels, measured on H800 with ~160 GB/s NVLink and one ~50 GB/s
# CX7 400 Gb/s NIC per GPU, DeepSeek-V3 shapes (docs/sources.md 12, deepseek-ai/DeepEP@0297fc8
# docs/legacy.md "Normal kernels with NVLink and RDMA forwarding"): intranode EP8 dispatch
# 153 GB/s and combine 158 GB/s of NVLink; internode EP16/32/64 43-58 GB/s of RDMA (bottleneck
# bandwidth, NVLink forwarding included). As fractions of the line rates: the mean of each.
DEEPEP_NVLINK_EFFICIENCY = (153 + 158) / 2 / 160
DEEPEP_RDMA_EFFICIENCY = min(1.0, (43 + 43 + 58 + 57 + 51 + 50) / 6 / 50)


def deepep_all_to_all(link: GroupLink, rank_bytes: float, calib: Calibration,
                      remote_bytes: float | None = None) -> CollectiveTime:
    """DeepEP's dispatch or combine (the flex dispatcher): ``all_to_all``'s split of a rank's
    ``rank_bytes`` between node-local peers over NVLink and remote ones over its NIC, at DeepEP's
    measured fractions of the line rates (its kernels forward RDMA traffic through NVLink, so
    the NIC's share is the bottleneck, not NCCL's pairwise exchange). ``remote_bytes``: what
    crosses the NIC when the caller knows it (a token sent once per remote node,
    dispatch.rdma_message); else the remote ranks' share of ``rank_bytes``."""
    n = link.size
    if n <= 1 or rank_bytes <= 0:
        return NO_TIME
    moved = (n - 1) / n * rank_bytes
    a_intra, a_inter = _latencies(link, calib, "all_to_all")
    nvlink = link.intra_bytes_per_s * DEEPEP_NVLINK_EFFICIENCY
    if not crosses_network(link):
        return _result(a_intra + moved / nvlink, "deepep", moved)
    m = link.max_gpus_per_node
    local = (m - 1) / n * rank_bytes / nvlink if m > 1 else 0.0
    if remote_bytes is None:
        remote_bytes = (n - m) / n * rank_bytes
    remote = remote_bytes / (link.inter_bytes_per_s * DEEPEP_RDMA_EFFICIENCY)
    return _result(a_inter + max(local, remote), "deepep", moved)


def send_recv(link: GroupLink, nbytes: float, calib: Calibration) -> CollectiveTime:
    """One point-to-point transfer between neighbours of the group (pipeline, CP ring)."""
    if link.size <= 1 or nbytes <= 0:
        return NO_TIME
    a_intra, a_inter = _latencies(link, calib, "send_recv")
    if crosses_network(link):
        time_s = a_inter + nbytes / _gpu_net_bw(link, calib, "send_recv")
    else:
        time_s = a_intra + nbytes / _intra_bw(link, calib, "send_recv")
    return _result(time_s, "p2p", nbytes)
