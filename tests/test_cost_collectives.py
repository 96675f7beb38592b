"""Collective times against hand-computed cases: ring, tree, NVLS, hierarchical, all-to-all, p2p.

Groups are hand-built GroupLink-like records, so each case pins one formula of
placer/cost/collectives.py without the topology in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from placer.cost import collectives as coll
from placer.cost.profile import (
    NETWORK_EFFICIENCY,
    NVLINK3_EFFICIENCY,
    NVLINK4_EFFICIENCY,
    NVLS_ALL_REDUCE_SPEEDUP,
    calibration_for,
)
from placer.spec.presets import cluster_preset
from placer.spec.profile import LinkClassProfile, LinkMeasurement, LinkProfile

GB = 1e9


@dataclass(frozen=True)
class Link:
    """The GroupLink fields the cost model reads (placer.topology's record has the same)."""

    size: int
    num_nodes: int = 1
    max_gpus_per_node: int = 8
    within_nvlink_domain: bool = True
    link_class: str = "nvlink"
    intra_bytes_per_s: float = 300e9
    inter_bytes_per_s: float = math.inf
    node_inter_bytes_per_s: float = math.inf
    intra_latency_s: float = 3e-6
    inter_latency_s: float = 0.0
    nvls: bool = False
    crosses_leaf: bool = False
    rail_aligned: bool = True


A100 = calibration_for(cluster_preset("dgx-a100"))
H100 = calibration_for(cluster_preset("dgx-h100"))


def network_link(nodes: int, per_node: int, per_gpu_net: float = 25e9) -> Link:
    return Link(size=nodes * per_node, num_nodes=nodes, max_gpus_per_node=per_node,
                within_nvlink_domain=False, link_class="network", inter_bytes_per_s=per_gpu_net,
                node_inter_bytes_per_s=per_gpu_net * per_node, inter_latency_s=8e-6)


def test_ring_all_reduce_inside_a_node_is_latency_plus_busbw_factor() -> None:
    link = Link(size=8)
    nbytes = 1 * GB
    busbw = 300e9 * NVLINK3_EFFICIENCY  # 232.5 GB/s, nccl-tests#175
    expected = 2 * 7 * 3e-6 + 2 * 7 / 8 * nbytes / busbw
    got = coll.all_reduce(link, nbytes, A100)
    assert got.algorithm == "ring"
    assert got.time_s == pytest.approx(expected, rel=1e-12)
    assert got.bus_bandwidth_bytes_per_s == pytest.approx(2 * 7 / 8 * nbytes / expected)


def test_all_gather_and_reduce_scatter_move_n_minus_1_over_n_of_the_total() -> None:
    link = Link(size=4, intra_bytes_per_s=450e9)
    nbytes = 2 * GB
    expected = 3 * 3e-6 + 3 / 4 * nbytes / (450e9 * NVLINK4_EFFICIENCY)
    assert coll.all_gather(link, nbytes, H100).time_s == pytest.approx(expected)
    assert coll.reduce_scatter(link, nbytes, H100).time_s == pytest.approx(expected)


def test_nvls_wins_large_all_reduce_in_an_nvls_domain() -> None:
    link = Link(size=8, intra_bytes_per_s=450e9, nvls=True)
    nbytes = 1 * GB
    got = coll.all_reduce(link, nbytes, H100)
    assert got.algorithm == "nvls"
    # ~480 GB/s busbw on H100 (docs/sources.md 4), plus two hops of latency.
    expected = 2 * 3e-6 + 2 * 7 / 8 * nbytes / (450e9 * NVLS_ALL_REDUCE_SPEEDUP)
    assert got.time_s == pytest.approx(expected)
    assert got.bus_bandwidth_bytes_per_s == pytest.approx(480e9, rel=0.01)


def test_cross_node_ring_is_bounded_by_the_nodes_network_not_one_nic() -> None:
    # 8 nodes x 8 GPUs, 25 GB/s per GPU: the ring uses all eight NICs (192 GB/s on DGX A100).
    link = network_link(nodes=8, per_node=8)
    nbytes = 4 * GB
    ring_bw = min(8 * 25e9 * NETWORK_EFFICIENCY, 300e9 * NVLINK3_EFFICIENCY)
    got = coll.all_reduce(link, nbytes, A100)
    moved = 2 * 63 / 64 * nbytes
    assert got.time_s <= 2 * 63 * 8e-6 + moved / ring_bw + 1e-12
    assert got.time_s > moved / (ring_bw * 1.01)


def test_tree_is_chosen_for_small_messages_across_many_nodes() -> None:
    link = network_link(nodes=64, per_node=8)
    small = coll.all_reduce(link, 64 * 1024, A100)
    large = coll.all_reduce(link, 8 * GB, A100)
    assert small.algorithm == "tree"
    assert large.algorithm != "tree"
    ring_latency = 2 * 511 * (3e-6 * (512 - 64) + 8e-6 * 64) / 512
    tree_latency = 2 * (7 * 3e-6 + 6 * 8e-6)
    assert small.time_s < ring_latency
    assert small.time_s > tree_latency


def test_hierarchical_all_reduce_is_intra_reduce_scatter_inter_all_reduce_intra_gather() -> None:
    # Intra-node links slow (PCIe-like): the hierarchical form beats the ring when the network is
    # fast per GPU; check its formula directly.
    link = replace(network_link(nodes=4, per_node=8, per_gpu_net=50e9), intra_bytes_per_s=64e9,
                   link_class="network")
    nbytes = 1 * GB
    intra_bw = 64e9 * A100.intra_efficiency
    expected = (2 * (7 * 3e-6 + 7 / 8 * nbytes / intra_bw)
                + 2 * 3 * 8e-6 + 2 * 3 / 4 * (nbytes / 8) / (50e9 * NETWORK_EFFICIENCY))
    assert coll._hierarchical(link, nbytes, A100) == pytest.approx(expected)


def test_all_to_all_volume_and_one_nic_per_gpu_across_nodes() -> None:
    # Each rank sends (n-1)/n of its buffer: (m-1)/n over NVLink, (n-m)/n over its own NIC.
    link = network_link(nodes=2, per_node=8, per_gpu_net=50e9)
    rank_bytes = 160e6
    remote = 8 / 16 * rank_bytes / (50e9 * NETWORK_EFFICIENCY)
    local = 7 / 16 * rank_bytes / (300e9 * NVLINK3_EFFICIENCY)
    got = coll.all_to_all(link, rank_bytes, A100)
    assert got.time_s == pytest.approx(8e-6 + max(local, remote))
    assert got.bus_bandwidth_bytes_per_s == pytest.approx(15 / 16 * rank_bytes / got.time_s)
    inside = coll.all_to_all(Link(size=8), rank_bytes, A100)
    assert inside.time_s == pytest.approx(3e-6 + 7 / 8 * rank_bytes / (300e9 *
                                                                        NVLINK3_EFFICIENCY))


def test_send_recv_uses_the_gpus_network_share_across_nodes() -> None:
    link = network_link(nodes=2, per_node=1, per_gpu_net=50e9)
    got = coll.send_recv(link, 100e6, H100)
    assert got.time_s == pytest.approx(8e-6 + 100e6 / (50e9 * NETWORK_EFFICIENCY))


def test_sharded_gathers_can_stay_on_each_gpus_own_nic() -> None:
    link = network_link(nodes=4, per_node=8)
    aggregated = coll.all_gather(link, 8 * GB, A100)
    per_gpu = coll.all_gather(link, 8 * GB, A100, aggregate_nics=False)
    assert per_gpu.time_s == pytest.approx(aggregated.time_s * 8, rel=0.05)


def test_groups_of_one_cost_nothing() -> None:
    lone = Link(size=1, link_class="local", intra_bytes_per_s=math.inf)
    for fn in (coll.all_reduce, coll.all_gather, coll.reduce_scatter, coll.all_to_all,
               coll.send_recv):
        assert fn(lone, 1e9, A100).time_s == 0.0


def test_a_link_profile_replaces_the_preset_constants() -> None:
    measured = LinkProfile(
        intra_node=LinkClassProfile(
            latency_s=10e-6, bandwidth_bytes_per_s=100e9,
            collectives={"all_reduce": LinkMeasurement(latency_s=20e-6,
                                                       bandwidth_bytes_per_s=50e9)}),
        inter_node=LinkClassProfile(latency_s=30e-6, bandwidth_bytes_per_s=10e9))
    calib = calibration_for(cluster_preset("dgx-h100"), measured)
    link = Link(size=8, intra_bytes_per_s=450e9, nvls=True)
    got = coll.all_reduce(link, 1 * GB, calib)
    assert got.algorithm == "ring"  # the measured figure already says what NCCL achieved
    assert got.time_s == pytest.approx(2 * 7 * 20e-6 + 2 * 7 / 8 * GB / 50e9)
    gather = coll.all_gather(link, 1 * GB, calib)
    assert gather.time_s == pytest.approx(7 * 10e-6 + 7 / 8 * GB / 100e9)
    p2p = coll.send_recv(network_link(nodes=2, per_node=1, per_gpu_net=50e9), 1e8, calib)
    assert p2p.time_s == pytest.approx(30e-6 + 1e8 / 10e9)
