"""placer.topology: slots, group link rules under concurrency, the graph, and their agreement."""

from __future__ import annotations

import math
from dataclasses import fields
from itertools import combinations
from typing import Any

import networkx as nx
import pytest

from placer.spec.cluster import Cluster
from placer.spec.presets import cluster_preset
from placer.topology import GroupLink, build_graph, topology_of
from placer.topology.links import PathHop, slower_class

NDR_BYTES_PER_S = 400e9 / 8  # NDR 400 Gb/s per NIC, bits -> bytes (docs/sources.md 5.1)
HDR_BYTES_PER_S = 200e9 / 8


def preset(name: str, nodes: int | None = None) -> Cluster:
    cluster = cluster_preset(name)
    return cluster if nodes is None else cluster.with_nodes(nodes)


def variant(name: str, nodes: int, **changes: Any) -> Cluster:
    """A preset with ``nodes`` nodes and top-level fields (network, excluded_gpus...) replaced."""
    data = preset(name, nodes).model_dump()
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return Cluster.model_validate(data)


def mixed(first: str, first_nodes: int, second: str, second_nodes: int) -> Cluster:
    a, b = preset(first), preset(second)
    return Cluster.model_validate({
        "name": "mixed",
        "node_types": [a.node_types[0].model_dump(), b.node_types[0].model_dump()],
        "pools": [{"node_type": a.node_types[0].name, "count": first_nodes},
                  {"node_type": b.node_types[0].name, "count": second_nodes}],
        "network": b.network.model_dump(),
    })


def custom_pcie(nodes: int = 1, **fabric: Any) -> Cluster:
    """An 8-GPU PCIe Gen4 server; ``fabric`` overrides switch, socket and NVLink fields."""
    base = {"kind": "pcie", "pcie_bandwidth_bytes_per_s": 32e9,
            "numa_groups": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    return Cluster.model_validate({
        "name": "custom",
        "node_types": [{"name": "box", "gpu": "A100-80GB", "gpus_per_node": 8,
                        "fabric": {**base, **fabric},
                        "nics": [{"name": "mlx5_0", "rate_gbps": 200, "gpus": [0, 1, 2, 3]},
                                 {"name": "mlx5_1", "rate_gbps": 200, "gpus": [4, 5, 6, 7]}]}],
        "pools": [{"node_type": "box", "count": nodes}],
        "network": {"kind": "roce", "rail_optimized": False, "nodes_per_leaf": 16},
    })


# ----- the contract the cost model relies on ---------------------------------------------------


def test_group_link_fields_are_the_agreed_contract() -> None:
    assert [f.name for f in fields(GroupLink)] == [
        "size", "num_nodes", "max_gpus_per_node", "within_nvlink_domain", "link_class",
        "intra_bytes_per_s", "inter_bytes_per_s", "node_inter_bytes_per_s", "intra_latency_s",
        "inter_latency_s", "nvls", "crosses_leaf", "rail_aligned"]
    link = topology_of(preset("dgx-h100", 2)).group_link([0])
    with pytest.raises(AttributeError):
        link.size = 2  # type: ignore[misc]


# ----- DGX H100, rail-optimized ---------------------------------------------------------------


def test_dgx_h100_tp_group_is_nvlink_only() -> None:
    topo = topology_of(preset("dgx-h100", 4))
    link = topo.group_link(range(8, 16))
    assert link.link_class == "nvlink"
    assert link.intra_bytes_per_s == 450e9
    assert link.inter_bytes_per_s == math.inf and link.node_inter_bytes_per_s == math.inf
    assert link.inter_latency_s == 0.0 and link.intra_latency_s == 3e-6
    assert (link.size, link.num_nodes, link.max_gpus_per_node) == (8, 1, 8)
    assert link.within_nvlink_domain and link.nvls and not link.crosses_leaf


def test_dgx_h100_dp_group_one_nic_per_gpu() -> None:
    topo = topology_of(preset("dgx-h100", 4))
    link = topo.group_link([3, 11, 19, 27], concurrent="all")
    assert link.link_class == "network"
    assert link.inter_bytes_per_s == NDR_BYTES_PER_S == 50e9
    assert link.node_inter_bytes_per_s == 50e9
    assert link.rail_aligned and not link.crosses_leaf
    assert link.intra_bytes_per_s == math.inf and link.intra_latency_s == 0.0
    assert link.inter_latency_s == 8e-6
    assert (link.num_nodes, link.max_gpus_per_node, link.within_nvlink_domain) == (4, 1, False)
    assert not link.nvls


def test_dgx_h100_two_full_nodes() -> None:
    link = topology_of(preset("dgx-h100", 4)).group_link(range(16))
    assert link.inter_bytes_per_s == 50e9
    assert link.node_inter_bytes_per_s == 8 * 50e9
    assert link.intra_bytes_per_s == 450e9
    assert link.rail_aligned and link.link_class == "network"


def test_cross_rail_group_is_not_rail_aligned() -> None:
    topo = topology_of(preset("dgx-h100", 2))
    assert not topo.group_link([0, 9]).rail_aligned  # GPU0 of node 0 with GPU1 of node 1
    assert topo.group_link([0, 1, 8, 9]).rail_aligned


def test_ring_bottleneck() -> None:
    topo = topology_of(preset("dgx-h100", 4))
    assert topo.ring_bottleneck([5]) == (math.inf, 0.0, "local")
    bandwidth, latency, link_class = topo.ring_bottleneck(range(8))
    assert (bandwidth, link_class) == (450e9, "nvlink")
    assert latency == pytest.approx(8 * 3e-6)
    bandwidth, latency, link_class = topo.ring_bottleneck(range(16))
    # 14 NVLink steps inside the two nodes plus 2 network steps, bounded by 8 NICs per node.
    assert (bandwidth, link_class) == (400e9, "network")
    assert latency == pytest.approx(14 * 3e-6 + 2 * 8e-6)
    assert topo.ring_bottleneck([0, 8, 16, 24])[0] == 50e9


def test_group_order_and_repeats() -> None:
    topo = topology_of(preset("dgx-h100", 4))
    assert topo.group_link([24, 0, 16, 8]) == topo.group_link([0, 8, 16, 24])
    with pytest.raises(ValueError):
        topo.group_link([0, 0])
    with pytest.raises(ValueError):
        topo.group_link([])
    with pytest.raises(IndexError):
        topo.group_link([0, 32])
    with pytest.raises(ValueError):
        topo.group_link([0, 8], concurrent="everyone")


# ----- shared NICs and concurrency ------------------------------------------------------------


def test_shared_nic_all_alone_and_explicit() -> None:
    topo = topology_of(preset("pcie-8x-l40s", 2))
    rate = HDR_BYTES_PER_S  # one 200 Gb/s NIC per 4 GPUs
    assert topo.group_link([0, 8], concurrent="all").inter_bytes_per_s == rate / 4
    assert topo.group_link([0, 8], concurrent="alone").inter_bytes_per_s == rate
    translates = [[g, 8 + g] for g in range(8)]
    assert topo.group_link([0, 8], concurrent=translates).inter_bytes_per_s == rate / 4
    assert topo.group_link([0, 8], concurrent=[[0, 8]]).inter_bytes_per_s == rate
    assert topo.group_link([0, 8], concurrent=[]).inter_bytes_per_s == rate
    # Two of the four GPUs on the NIC busy: each gets half.
    assert topo.group_link([0, 8], concurrent=[[1, 9]]).inter_bytes_per_s == rate / 2
    assert not topo.group_link([0, 8]).rail_aligned  # not a rail-optimized fabric


def test_shared_nic_with_excluded_gpu_uses_the_busiest_node() -> None:
    cluster = variant("pcie-8x-l40s", 2, excluded_gpus=[{"node": 0, "gpu": 1}])
    topo = topology_of(cluster)
    link = topo.group_link([topo.slot_of(0, 0), topo.slot_of(1, 0)])
    # Node 0 shares its NIC among 3 healthy GPUs, node 1 among 4: node 1 is the bottleneck.
    assert link.inter_bytes_per_s == HDR_BYTES_PER_S / 4
    assert link.node_inter_bytes_per_s == HDR_BYTES_PER_S / 4


def test_nic_share_is_capped_by_the_gpu_pcie_link() -> None:
    cluster = custom_pcie(2)
    data = cluster.model_dump()
    data["node_types"][0]["nics"] = [{"name": "mlx5_0", "rate_gbps": 800, "gpus": [0]}]
    topo = topology_of(Cluster.model_validate(data))
    # GPU 0 alone on an 800 Gb/s (100 GB/s) NIC behind a Gen4 x16 link (32 GB/s).
    assert topo.group_link([0, 8], "alone").inter_bytes_per_s == 32e9
    # GPUs 1-7 are listed by no NIC: they reach the node's only NIC, so under "all" it is
    # shared by all 8 GPUs.
    assert topo.group_link([1, 9], "alone").inter_bytes_per_s == 32e9
    assert topo.group_link([1, 9]).inter_bytes_per_s == 100e9 / 8


# ----- PCIe boxes -----------------------------------------------------------------------------


def test_pcie_same_switch_vs_across_sockets() -> None:
    topo = topology_of(preset("pcie-8x-l40s", 1))
    same_switch, sys = topo.group_link([0, 1]), topo.group_link([0, 4])
    assert same_switch.link_class == sys.link_class == "pcie"
    assert not same_switch.within_nvlink_domain and not same_switch.nvls
    assert same_switch.intra_bytes_per_s == 32e9
    assert same_switch.intra_latency_s == 6e-6
    # SYS: every GPU of switch 0 crosses to socket 1 at once -> 4 flows per uplink/socket link.
    assert sys.intra_bytes_per_s == 32e9 / 4 < same_switch.intra_bytes_per_s
    # Alone, a single SYS flow per direction still gets no more than the same-switch pair.
    alone = topo.group_link([0, 4], "alone").intra_bytes_per_s
    assert alone <= topo.group_link([0, 1], "alone").intra_bytes_per_s
    # The explicit list of the four cross-socket pairs is the same load as "all".
    pairs = [[g, g + 4] for g in range(4)]
    assert topo.group_link([0, 4], concurrent=pairs).intra_bytes_per_s == 32e9 / 4


def test_pcie_levels_pix_phb_sys_are_ordered() -> None:
    cluster = custom_pcie(pcie_switch_groups=[[0, 1], [2, 3], [4, 5], [6, 7]])
    topo = topology_of(cluster)
    pix = topo.group_link([0, 1]).intra_bytes_per_s  # same switch
    phb = topo.group_link([0, 2]).intra_bytes_per_s  # other switch, same socket
    sys = topo.group_link([0, 4]).intra_bytes_per_s  # other socket
    assert pix == 32e9
    assert phb == 32e9 / 2  # both GPUs of switch 0 leave it through one uplink
    assert sys == 32e9 / 4  # all four GPUs of socket 0 cross to socket 1
    assert pix > phb > sys


def test_whole_pcie_node_ring_crosses_sockets_once_per_direction() -> None:
    link = topology_of(preset("pcie-8x-l40s", 1)).group_link(range(8))
    assert link.intra_bytes_per_s == 32e9
    assert link.link_class == "pcie" and link.inter_bytes_per_s == math.inf


def test_nvlink_bridge_pairs() -> None:
    # PCIe A100 with NVLink bridge pairs (docs/sources.md 8.2 (d)).
    topo = topology_of(custom_pcie(kind="nvlink_bridge", nvlink_bandwidth_bytes_per_s=300e9,
                                   nvlink_groups=[[0, 1], [2, 3], [4, 5], [6, 7]]))
    pair = topo.group_link([0, 1])
    assert pair.link_class == "nvlink" and pair.within_nvlink_domain
    assert pair.intra_bytes_per_s == 300e9 and not pair.nvls
    across = topo.group_link([0, 1, 2, 3])
    assert across.link_class == "pcie" and not across.within_nvlink_domain
    assert topo.nvlink_domain_of(0) == topo.nvlink_domain_of(1) != topo.nvlink_domain_of(2)


def test_pcie_only_gpus_are_their_own_domains() -> None:
    topo = topology_of(preset("pcie-8x-l40s", 1))
    assert len({topo.nvlink_domain_of(s) for s in range(8)}) == 8
    assert topo.group_link([3]).within_nvlink_domain
    assert topo.group_link([3]).link_class == "local"


# ----- irregular and mixed clusters -----------------------------------------------------------


def test_excluded_gpu_is_skipped_in_slots() -> None:
    cluster = variant("dgx-h100", 3, excluded_gpus=[{"node": 1, "gpu": 3}])
    topo = topology_of(cluster)
    assert topo.num_gpus == 23 and len(topo.slots) == 23
    assert topo.slots[8:16] == ((1, 0), (1, 1), (1, 2), (1, 4), (1, 5), (1, 6), (1, 7), (2, 0))
    assert [topo.node_of(s) for s in (7, 8, 14, 15)] == [0, 1, 1, 2]
    assert topo.local_gpu_of(11) == 4 and topo.slot_of(1, 4) == 11 and topo.slot_of(2, 0) == 15
    assert all(topo.slot_of(*topo.slots[s]) == s for s in range(topo.num_gpus))
    with pytest.raises(ValueError):
        topo.slot_of(1, 3)
    node1 = topo.group_link(range(8, 15))
    assert (node1.size, node1.num_nodes, node1.link_class) == (7, 1, "nvlink")
    dp = topo.group_link([topo.slot_of(n, 4) for n in range(3)])
    assert dp.rail_aligned and dp.inter_bytes_per_s == 50e9 and dp.num_nodes == 3
    assert topo.nodes_of([0, 8, 15]) == (0, 1, 2)
    assert topo.spans_nodes([0, 15]) and not topo.spans_nodes(range(8, 15))
    assert ("gpu", 1, 3) not in build_graph(cluster)
    assert build_graph(cluster).nodes[("gpu", 1, 4)]["slot"] == 11


def test_mixed_a100_h100_uses_the_slower_pool() -> None:
    topo = topology_of(mixed("dgx-a100", 2, "dgx-h100", 2))
    assert topo.group_link(range(8)).intra_bytes_per_s == 300e9
    assert topo.group_link(range(16, 24)).intra_bytes_per_s == 450e9
    across = topo.group_link(range(8, 24))  # A100 node 1 and H100 node 2
    assert across.intra_bytes_per_s == 300e9
    assert across.inter_bytes_per_s == HDR_BYTES_PER_S
    assert across.node_inter_bytes_per_s == 8 * HDR_BYTES_PER_S
    h100_only = topo.group_link(range(16, 32))
    assert h100_only.node_inter_bytes_per_s == 8 * NDR_BYTES_PER_S


def test_mixed_gpus_per_node_slot_numbering() -> None:
    topo = topology_of(mixed("gb200-nvl72", 2, "dgx-h100", 2))
    assert topo.num_gpus == 2 * 4 + 2 * 8
    assert [topo.node_of(s) for s in (0, 3, 4, 7, 8, 15, 16, 23)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert topo.slot_of(2, 0) == 8 and topo.local_gpu_of(17) == 1
    # Both trays are in one (partial) NVL72 domain; the H100 nodes are separate islands.
    assert topo.group_link(range(8)).within_nvlink_domain
    assert topo.group_link([0, 8]).link_class == "network"


# ----- GB200 NVL72 ----------------------------------------------------------------------------


def test_nvl72_group_over_trays_stays_on_nvlink() -> None:
    topo = topology_of(preset("gb200-nvl72"))
    link = topo.group_link(range(16))  # 4 trays x 4 GPUs
    assert link.within_nvlink_domain and link.link_class == "nvlink"
    assert (link.num_nodes, link.max_gpus_per_node) == (4, 4)
    assert link.intra_bytes_per_s == 900e9 and link.inter_bytes_per_s == math.inf
    assert link.nvls
    assert topo.nvlink_domain_of(0) == topo.nvlink_domain_of(71)


def test_two_nvl72_racks_join_over_the_network() -> None:
    topo = topology_of(preset("gb200-nvl72", 36))
    assert topo.nvlink_domain_of(71) != topo.nvlink_domain_of(72)
    link = topo.group_link([*range(16), *range(72, 88)])
    assert link.link_class == "network" and not link.within_nvlink_domain
    assert link.num_nodes == 8 and link.inter_bytes_per_s == NDR_BYTES_PER_S
    # The most constrained island is a whole NVL72 domain: 16 members with a NIC each.
    assert link.node_inter_bytes_per_s == 16 * NDR_BYTES_PER_S
    assert link.intra_bytes_per_s == 900e9


# ----- oversubscription -----------------------------------------------------------------------


def oversubscribed(nodes: int) -> Cluster:
    return variant("dgx-h100", nodes, network={"nodes_per_leaf": 2, "oversubscription": 2.0})


def test_oversubscribed_group_across_leaves_is_halved() -> None:
    topo = topology_of(oversubscribed(4))
    across = topo.group_link([0, 8, 16, 24])
    assert across.crosses_leaf and across.inter_bytes_per_s == 25e9
    assert across.node_inter_bytes_per_s == 25e9
    inside = topo.group_link([0, 8])
    assert not inside.crosses_leaf and inside.inter_bytes_per_s == 50e9


def test_cross_rail_on_oversubscribed_rail_fabric_is_halved() -> None:
    topo = topology_of(oversubscribed(4))
    link = topo.group_link([0, 9])  # same leaf group, different rails: through the spine
    assert not link.crosses_leaf and not link.rail_aligned
    assert link.inter_bytes_per_s == 25e9


def test_oversubscription_alone_depends_on_leaf_load() -> None:
    topo = topology_of(oversubscribed(8))
    # Nodes 0 and 2 in different leaf groups; alone, one of the two rail-0 ports of each leaf
    # climbs, which the 2:1 uplink still carries at full rate.
    assert topo.group_link([0, 16], "alone").inter_bytes_per_s == 50e9
    assert topo.group_link([0, 16], "all").inter_bytes_per_s == 25e9
    # Both ports of each rail-0 leaf climbing saturate the uplink.
    assert topo.group_link([0, 8, 16, 24], "alone").inter_bytes_per_s == 25e9


def test_no_network_means_unreachable() -> None:
    topo = topology_of(variant("dgx-h100", 2, network={"kind": "none"}))
    link = topo.group_link([0, 8])
    assert link.link_class == "network" and link.inter_bytes_per_s == 0.0
    assert topo.group_link(range(8)).intra_bytes_per_s == 450e9


# ----- the graph ------------------------------------------------------------------------------


def test_graph_structure_dgx() -> None:
    cluster = preset("dgx-h100", 2)
    graph = build_graph(cluster)
    assert graph is build_graph(cluster) and nx.is_frozen(graph)
    gpus = [v for v in graph if v[0] == "gpu"]
    assert len(gpus) == 16
    assert len([v for v in graph if v[0] == "nvswitch"]) == 2
    assert len([v for v in graph if v[0] == "leaf"]) == 8  # one per rail, one leaf group
    rail = graph.edges[("nic", 0, 0), ("leaf", 0, 0)]
    assert rail["bandwidth_bytes_per_s"] == 50e9 and rail["link_class"] == "network"
    assert rail["latency_s"] == cluster.latency.network_s
    nvlink = graph.edges[("gpu", 0, 0), ("nvswitch", 0)]
    assert nvlink["link_class"] == "nvlink" and nvlink["bandwidth_bytes_per_s"] == 450e9
    assert graph.edges[("cpu", 0, 0), ("cpu", 0, 1)]["kind"] == "sys"
    assert graph.has_edge(("gpu", 1, 2), ("nic", 1, 2))
    assert not graph.has_edge(("gpu", 1, 2), ("nic", 1, 3))


def test_graph_structure_bridges_and_plain_leaves() -> None:
    cluster = custom_pcie(2, kind="nvlink_bridge", nvlink_bandwidth_bytes_per_s=300e9,
                          nvlink_groups=[[0, 1], [2, 3]])
    graph = build_graph(cluster)
    bridge = ("nvlink_bridge", 0, 0)
    assert sorted(graph[bridge]) == [("gpu", 0, 0), ("gpu", 0, 1)]
    nvlink_peers = [v for v in graph[("gpu", 0, 4)]
                    if graph.edges[("gpu", 0, 4), v]["link_class"] == "nvlink"]
    assert nvlink_peers == []  # GPU 4 has no bridge
    assert [v for v in graph if v[0] == "leaf"] == [("leaf", 0)]
    assert graph.edges[("nic", 1, 0), ("leaf", 0)]["bandwidth_bytes_per_s"] == 25e9


def test_graph_nvl72_domain_spans_trays() -> None:
    graph = build_graph(preset("gb200-nvl72", 36))
    switches = [v for v in graph if v[0] == "nvswitch"]
    assert len(switches) == 2
    assert len(graph[switches[0]]) == 72


def test_queries_do_not_build_the_graph() -> None:
    topo = topology_of(preset("dgx-h100", 12_500))  # 100,000 GPUs
    assert topo.num_gpus == 100_000
    assert topo.group_link(range(8)).link_class == "nvlink"
    assert topo.group_link(range(0, 8 * 64, 8)).node_inter_bytes_per_s == 50e9
    assert topo.node_of(99_999) == 12_499 and topo.slot_of(12_499, 7) == 99_999
    assert "graph" not in topo.__dict__ and "slots" not in topo.__dict__


def test_topology_is_cached_per_cluster_object() -> None:
    cluster = preset("dgx-h100", 2)
    assert topology_of(cluster) is topology_of(cluster)
    assert topology_of(cluster.with_nodes(2)) is not topology_of(cluster)


def path_summary(hops: list[PathHop]) -> tuple[float, float, str]:
    """(narrowest bytes/s, latency of one step, slowest class) of a route.

    A step's latency is that of its slowest link class (cluster.latency is per ring step, and
    switches on the way are cut-through).
    """
    if not hops:
        return math.inf, 0.0, "local"
    slowest = "local"
    for hop in hops:
        slowest = slower_class(slowest, hop.link_class)
    latency = max(hop.latency_s for hop in hops if hop.link_class == slowest)
    return min(hop.bandwidth_bytes_per_s for hop in hops), latency, slowest


@pytest.mark.parametrize("cluster", [
    # 4:1 under 2-node leaves: a lone flow across leaves is limited by the 100/4 GB/s uplink.
    variant("dgx-h100", 4, network={"nodes_per_leaf": 2, "oversubscription": 4.0}),
    preset("pcie-8x-l40s", 2),
    custom_pcie(2, kind="nvlink_bridge", nvlink_bandwidth_bytes_per_s=300e9,
                nvlink_groups=[[0, 1], [2, 3]], pcie_switch_groups=[[0, 1], [2, 3], [4, 5]]),
    variant("gb200-nvl72", 20, network={"nodes_per_leaf": 2, "oversubscription": 3.0}),
    mixed("dgx-a100", 1, "dgx-h100", 2),
], ids=["dgx-oversub", "l40s", "bridges", "nvl72-two-domains", "mixed"])
def test_fast_rules_match_graph_routes(cluster: Cluster) -> None:
    """For every lone pair, the fast ring rules give the graph route's narrowest edge, slowest
    class and latency (a two-member ring is two steps)."""
    topo = topology_of(cluster)
    pairs = list(combinations(range(topo.num_gpus), 2))
    if len(pairs) > 600:
        pairs = pairs[:: len(pairs) // 600]
    for a, b in pairs:
        bandwidth, latency, link_class = path_summary(topo.path(a, b))
        fast = topo.ring_bottleneck([a, b], concurrent="alone")
        assert fast == (pytest.approx(bandwidth), pytest.approx(2 * latency), link_class), (a, b)
        assert topo.group_link([a, b], "alone").link_class == link_class
