"""The placer Cluster that describes an emulated cluster (``--emulate NODESxGPUS``) on CPUs.

Each "GPU" is one rank's share of the machine's CPU; ranks of a node talk over the namespace's
loopback (modelled as a PCIe fabric), and each node has one "NIC" at the tbf rate. The figures
are starting values for the cost model before calibration; ``placer calibrate`` measures the real
ones and writes them to a link profile, which is what predictions should use.
"""

from __future__ import annotations

from placer.spec.cluster import Cluster

CPU_GPU_NAME = "cpu-share"
# One AVX-512 core in fp32 (what the GEMM stand-in runs on CPUs): 2 FMA pipes x 16 lanes x 2 FLOPs
# x ~3 GHz = 1.9e11. torch 2.13 reached 0.8-1.0e11 single-threaded for n = 128..1024 on the CI
# box (AMD EPYC, 2 cores), so calibrated GEMM efficiencies land near 0.5 alone and lower when
# ranks share cores. An upper bound, so a measured efficiency never exceeds 1.
CPU_SHARE_FLOPS = 2.0e11
CPU_SHARE_MEMORY_BYTES = 4 * 2**30  # a modest budget per rank; the CI box has 24 GiB for 4-8
# DDR bandwidth one rank can stream: about 10 GB/s per core on current servers [assumed; only the
# optimizer and element-wise terms use it, and they are small for the example models].
CPU_SHARE_MEMORY_BYTES_PER_S = 1.0e10
# Loopback between ranks of one namespace: gloo all_reduce reaches 0.7 GB/s bus bandwidth at
# p = 4 on 2 cores (cpu-cluster-notes.md section 3); the cost model takes 0.75 of a PCIe rate
# as bus bandwidth, so 1e9 B/s models ~0.75 GB/s.
LOOPBACK_BYTES_PER_S = 1.0e9
# Per-step latency: gloo all_reduce costs ~0.9 ms per ring step at p = 4 on 2 cores
# (cpu-cluster-notes.md section 3: oversubscription, not the network). The veth RTT is 19 us
# (section 4), so the network step is assumed to cost the same gloo overhead.
GLOO_STEP_LATENCY_S = 9.0e-4
# An unshaped veth pair between namespaces: bounded by the same 2 cores as loopback, which moved
# 21.6 Gbit/s in one TCP stream (cpu-cluster-notes.md section 4); 10 Gbit/s is the order of it.
UNSHAPED_VETH_MBIT = 10_000.0


def emulated_cluster_document(nodes: int, gpus_per_node: int,
                              inter_node_mbit: float | None) -> dict[str, object]:
    """The cluster file (as a mapping) for ``nodes`` x ``gpus_per_node`` emulated ranks."""
    gpus = list(range(gpus_per_node))
    rate = "unshaped" if inter_node_mbit is None else f"{inter_node_mbit:g} Mbit/s"
    node_type: dict[str, object] = {
        "name": "cpu-node",
        "gpu": {
            "name": CPU_GPU_NAME,
            "memory_bytes": CPU_SHARE_MEMORY_BYTES,
            "bf16_flops": CPU_SHARE_FLOPS,
            "hbm_bandwidth_bytes_per_s": CPU_SHARE_MEMORY_BYTES_PER_S,
        },
        "gpus_per_node": gpus_per_node,
        "fabric": {"kind": "pcie", "pcie_bandwidth_bytes_per_s": LOOPBACK_BYTES_PER_S},
        "nics": [{"name": "veth0", "rate_gbps": (inter_node_mbit or UNSHAPED_VETH_MBIT) / 1000.0,
                  "gpus": gpus}],
    }
    return {
        "name": f"emulated-{nodes}x{gpus_per_node}",
        "description": f"{nodes} network namespaces x {gpus_per_node} CPU ranks, {rate} tbf "
                       "between nodes (placer verify --emulate)",
        "node_types": [node_type],
        "pools": [{"node_type": "cpu-node", "count": nodes}],
        "network": {"kind": "ethernet", "rail_optimized": False},
        "latency": {"pcie_s": GLOO_STEP_LATENCY_S, "network_s": GLOO_STEP_LATENCY_S},
    }


def emulated_cluster(nodes: int, gpus_per_node: int, inter_node_mbit: float | None) -> Cluster:
    return Cluster.model_validate(
        emulated_cluster_document(nodes, gpus_per_node, inter_node_mbit))


def oversubscription_note(ranks: int, cores: int | None = None) -> str | None:
    """One line on what the emulated cluster's predictions leave out when its ranks outnumber
    the machine's cores: a rank blocked on the network frees its core, so the computing ranks of
    a network-bound candidate run faster than the calibrated GEMM rate (bench/results/
    verify_emulated-2026-12-01.txt, run 3). None when every rank has a core."""
    import os

    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    if ranks <= cores:
        return None
    return (f"not modelled: {ranks} ranks share {cores} cores here, so while some wait on the "
            "network the others compute faster than calibrated; network-bound candidates "
            "(TP or PP across nodes) measure faster than predicted")
