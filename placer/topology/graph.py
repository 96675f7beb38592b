"""The cluster as a hierarchical networkx graph, for explanations and irregular clusters.

Vertices (tuples, so their kind is their first element):
``("gpu", node, gpu)``, ``("nvswitch", domain_id)`` (one per NVLink domain; an NVL72 domain spans
trays), ``("nvlink_bridge", node, group)``, ``("pcie_switch", node, switch)``,
``("cpu", node, socket)``, ``("nic", node, position)``, ``("leaf", leaf_group, rail)`` on a
rail-optimized fabric else ``("leaf", leaf_group)``, and ``("spine",)``.

Edges carry ``bandwidth_bytes_per_s`` (per direction), ``link_class`` (nvlink / pcie / network),
``latency_s`` (cluster.latency of that class) and ``kind`` (nvlink, pcie, uplink, sys, nic, rail,
spine). A leaf's spine edge carries the leaf's total NIC rate / oversubscription. The numbers come
from the same NodeLayout tables as the fast queries in ``groups``, so a route's narrowest edge
equals what ``ring_bottleneck`` gives a lone pair.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

from placer.topology.links import PathHop, class_latency_s

if TYPE_CHECKING:
    import networkx as nx

    from placer.topology.cluster_topology import ClusterTopology
    from placer.topology.node_layout import NodeLayout

Edge = tuple[Hashable, Hashable, dict[str, Any]]

# Route preference: any NVLink route before any PCIe route before any network route.
_CLASS_WEIGHT = {"nvlink": 1.0, "pcie": 1.0e3, "network": 1.0e6}


class _Templates:
    """Shared edge-attribute dicts of one node layout (networkx copies them per edge)."""

    def __init__(self, topo: ClusterTopology, layout: NodeLayout) -> None:
        latency = topo.latency

        def attrs(kind: str, link_class: str, rate: float) -> dict[str, Any]:
            return {"bandwidth_bytes_per_s": rate, "link_class": link_class,
                    "latency_s": class_latency_s(latency, link_class), "kind": kind}

        pcie = layout.pcie_bytes_per_s
        self.nvlink = attrs("nvlink", "nvlink", layout.nvlink_bytes_per_s)
        self.pcie = attrs("pcie", "pcie", pcie)
        self.uplink = attrs("uplink", "pcie", pcie)
        self.sys = attrs("sys", "pcie", pcie)
        self.nic = attrs("nic", "pcie", pcie)
        self.rail = [attrs("rail", "network", rate) for rate in layout.nic_rate_bytes_per_s]


def _node_edges(topo: ClusterTopology, node: int, layout: NodeLayout, t: _Templates,
                ) -> Iterator[Edge]:
    fabric = layout.node_type.fabric
    network = topo.network
    num_switch_groups = len(fabric.pcie_switch_groups)
    for socket in range(1, layout.num_sockets):
        for other in range(socket):
            yield ("cpu", node, other), ("cpu", node, socket), t.sys
    for switch in range(num_switch_groups):
        yield ("pcie_switch", node, switch), ("cpu", node, layout.switch_socket[switch]), t.uplink
    if fabric.kind == "nvswitch" and topo.spans_domain_nodes(node):
        nvswitch_base = topo.island_of(node) * topo.domain_stride
    else:
        nvswitch_base = node * topo.domain_stride
    leaf_group = topo.leaf_group_of(node)
    for g in layout.healthy:
        gpu = ("gpu", node, g)
        domain = layout.domain_of[g]
        if fabric.kind == "nvswitch":
            yield gpu, ("nvswitch", nvswitch_base + domain), t.nvlink
        elif fabric.kind == "nvlink_bridge" and domain < len(fabric.nvlink_groups):
            yield gpu, ("nvlink_bridge", node, domain), t.nvlink
        switch = layout.switch_of[g]
        if switch < num_switch_groups:
            yield gpu, ("pcie_switch", node, switch), t.pcie
        else:
            yield gpu, ("cpu", node, layout.socket_of[g]), t.pcie
        for nic in layout.nics_of[g]:
            yield gpu, ("nic", node, nic), t.nic
    for nic in range(len(layout.nic_rate_bytes_per_s)):
        leaf = ("leaf", leaf_group, nic) if network.rail_optimized else ("leaf", leaf_group)
        yield ("nic", node, nic), leaf, t.rail[nic]


def _spine_edges(topo: ClusterTopology, leaves: dict[Hashable, None]) -> Iterator[Edge]:
    latency = class_latency_s(topo.latency, "network")
    for leaf in leaves:
        rail = leaf[2] if len(leaf) == 3 else -1
        capacity = topo.leaf_capacity_bytes_per_s(leaf[1], rail)
        yield leaf, ("spine",), {
            "bandwidth_bytes_per_s": capacity / topo.network.oversubscription,
            "link_class": "network", "latency_s": latency, "kind": "spine"}


def graph_of(topo: ClusterTopology) -> nx.Graph:
    """Build the frozen graph of a topology (one pass over nodes; no path computation)."""
    import networkx as nx

    graph = nx.Graph(name=topo.cluster.name)
    templates: dict[int, _Templates] = {}
    leaves: dict[Hashable, None] = {}

    def all_edges() -> Iterator[Edge]:
        for node in range(topo.num_nodes):
            layout = topo.layout_of(node)
            t = templates.get(id(layout))
            if t is None:
                t = templates[id(layout)] = _Templates(topo, layout)
            for edge in _node_edges(topo, node, layout, t):
                if edge[1][0] == "leaf":
                    leaves[edge[1]] = None
                yield edge

    graph.add_nodes_from(
        (("gpu", node, gpu), {"kind": "gpu", "slot": slot})
        for slot, (node, gpu) in enumerate(topo.slots)
    )
    graph.add_edges_from(all_edges())
    graph.add_edges_from(_spine_edges(topo, leaves))
    return nx.freeze(graph)


def route(graph: nx.Graph, a: Hashable, b: Hashable) -> list[PathHop]:
    """The preferred route from GPU ``a`` to GPU ``b``: never through a third GPU, NVLink before
    PCIe before the network, then fewest hops."""
    import networkx as nx

    if a == b:
        return []

    def weight(u: Hashable, v: Hashable, data: dict[str, Any]) -> float | None:
        for end in (u, v):
            if end[0] == "gpu" and end != a and end != b:  # type: ignore[index]
                return None
        return _CLASS_WEIGHT[data["link_class"]]

    _, vertices = nx.bidirectional_dijkstra(graph, a, b, weight=weight)
    hops = []
    for u, v in zip(vertices, vertices[1:], strict=False):
        data = graph.edges[u, v]
        hops.append(PathHop(u, v, data["link_class"], data["kind"],
                            data["bandwidth_bytes_per_s"], data["latency_s"]))
    return hops
