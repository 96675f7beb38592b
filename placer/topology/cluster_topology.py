"""The cluster as slots (torchrun ranks under the natural launch) plus O(group) link queries.

Nothing here enumerates the cluster per query: node types, NVLink domains, leaf groups and slot
numbers are computed arithmetically (or by bisection when GPUs are excluded or node types mix).
The networkx graph (``graph``) is built only when asked for.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from functools import cached_property, lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING

from placer.spec.cluster import Cluster, NodeType
from placer.topology.groups import Concurrency, analyze, group_link_of, ring_of
from placer.topology.links import GroupLink, PathHop
from placer.topology.node_layout import NodeLayout, node_layout, nvlink_nodes_per_domain

if TYPE_CHECKING:
    import networkx as nx

QUERY_CACHE_SIZE = 16_384
TOPOLOGY_CACHE_SIZE = 16


class ClusterTopology:
    """Healthy GPUs as slots, and what any group of slots gets from the hardware.

    Slot i is torchrun rank i when every node is launched as a contiguous block: nodes in order,
    healthy local GPUs ascending. Use ``topology_of(cluster)`` to get a cached instance.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.network = cluster.network
        self.latency = cluster.latency
        self.has_network = cluster.network.kind != "none"
        types = {t.name: t for t in cluster.node_types}
        self._pool_types: list[NodeType] = [types[p.node_type] for p in cluster.pools]
        self._pool_starts: list[int] = list(accumulate((p.count for p in cluster.pools), initial=0))
        self.num_nodes: int = self._pool_starts[-1]
        self._pool_nodes_per_domain = [nvlink_nodes_per_domain(t) for t in self._pool_types]
        self.has_multinode_domains = max(self._pool_nodes_per_domain) > 1
        excluded: dict[int, set[int]] = {}
        for ref in cluster.excluded_gpus:
            excluded.setdefault(ref.node, set()).add(ref.gpu)
        self._excluded = {node: frozenset(gpus) for node, gpus in sorted(excluded.items())}
        self._layouts: dict[tuple[str, frozenset[int]], NodeLayout] = {}
        self._pool_layouts = [self._layout(t, frozenset()) for t in self._pool_types]
        self.domain_stride = max(t.gpus_per_node for t in self._pool_types)
        gpus_per_node = {t.gpus_per_node for t in self._pool_types}
        self._uniform_gpn = gpus_per_node.pop() if len(gpus_per_node) == 1 and not excluded else 0
        self._first_slot: list[int] = [] if self._uniform_gpn else self._first_slots()
        self.num_gpus: int = cluster.num_gpus
        self._leaf_capacity: dict[tuple[int, int], float] = {}
        self._query = lru_cache(maxsize=QUERY_CACHE_SIZE)(self._group_link_uncached)

    # ----- nodes and slots -------------------------------------------------------------------

    def _layout(self, node_type: NodeType, excluded: frozenset[int]) -> NodeLayout:
        key = (node_type.name, excluded)
        layout = self._layouts.get(key)
        if layout is None:
            healthy = tuple(g for g in range(node_type.gpus_per_node) if g not in excluded)
            layout = node_layout(node_type, healthy, network=self.has_network)
            self._layouts[key] = layout
        return layout

    def _pool_of(self, node: int) -> int:
        if len(self._pool_starts) == 2:
            return 0
        return bisect_right(self._pool_starts, node) - 1

    @property
    def uniform_gpus_per_node(self) -> int:
        """GPUs per node when every node has all of the same count healthy (slot = node*n+gpu),
        else 0."""
        return self._uniform_gpn

    def _first_slots(self) -> list[int]:
        counts = []
        for pool, start in enumerate(self._pool_starts[:-1]):
            full = self._pool_types[pool].gpus_per_node
            counts.extend([full] * (self._pool_starts[pool + 1] - start))
        for node, gpus in self._excluded.items():
            counts[node] -= len(gpus)
        return list(accumulate(counts, initial=0))

    def _check_node(self, node: int) -> None:
        if not 0 <= node < self.num_nodes:
            raise IndexError(f"node {node} is outside 0..{self.num_nodes - 1}")

    def layout_of(self, node: int) -> NodeLayout:
        """The lookup tables of one node (its type, healthy GPUs, switches, sockets, NICs)."""
        self._check_node(node)
        pool = self._pool_of(node)
        excluded = self._excluded.get(node)
        if excluded is None:
            return self._pool_layouts[pool]
        return self._layout(self._pool_types[pool], excluded)

    def node_of(self, slot: int) -> int:
        if not 0 <= slot < self.num_gpus:
            raise IndexError(f"slot {slot} is outside 0..{self.num_gpus - 1}")
        if self._uniform_gpn:
            return slot // self._uniform_gpn
        return bisect_right(self._first_slot, slot) - 1

    def first_slot_of(self, node: int) -> int:
        self._check_node(node)
        return node * self._uniform_gpn if self._uniform_gpn else self._first_slot[node]

    def local_gpu_of(self, slot: int) -> int:
        node = self.node_of(slot)
        return self.layout_of(node).healthy[slot - self.first_slot_of(node)]

    def slot_of(self, node: int, gpu: int) -> int:
        """The slot of local GPU ``gpu`` on ``node``; ValueError if it is excluded or absent."""
        healthy = self.layout_of(node).healthy
        if self._uniform_gpn and 0 <= gpu < self._uniform_gpn:
            return node * self._uniform_gpn + gpu
        if gpu not in healthy:
            raise ValueError(f"GPU {gpu} of node {node} is excluded or does not exist")
        return self.first_slot_of(node) + healthy.index(gpu)

    def locate(self, slot: int) -> tuple[int, int]:
        """(node, local GPU) of a slot."""
        node = self.node_of(slot)
        return node, self.layout_of(node).healthy[slot - self.first_slot_of(node)]

    @cached_property
    def slots(self) -> tuple[tuple[int, int], ...]:
        """Every healthy GPU as (node, local GPU), in slot order."""
        return tuple((node, gpu) for node in range(self.num_nodes)
                     for gpu in self.layout_of(node).healthy)

    def nodes_of(self, slots: Sequence[int]) -> tuple[int, ...]:
        """Distinct nodes holding the slots, ascending."""
        return tuple(sorted({self.node_of(int(s)) for s in slots}))

    def spans_nodes(self, slots: Sequence[int]) -> bool:
        return len(self.nodes_of(slots)) > 1

    # ----- NVLink domains, islands, leaves -------------------------------------------------------

    def island_of(self, node: int) -> int:
        """First node of the node's NVLink domain when it spans nodes (NVL72), else the node.

        Members of one island talk without the network; the network joins islands.
        """
        pool = self._pool_of(node)
        per_domain = self._pool_nodes_per_domain[pool]
        if per_domain == 1:
            return node
        start = self._pool_starts[pool]
        return start + (node - start) // per_domain * per_domain

    def spans_domain_nodes(self, node: int) -> bool:
        """Whether the node's NVLink domain spans several nodes (GB200 NVL72 trays)."""
        return self._pool_nodes_per_domain[self._pool_of(node)] > 1

    def nvlink_domain_of(self, slot: int) -> int:
        """Opaque NVLink domain id: equal for two slots iff NVLink joins them directly.

        On PCIe-only nodes each GPU is its own domain; with NVLink bridges, the bridge group.
        """
        node, gpu = self.locate(slot)
        if self.spans_domain_nodes(node):
            return self.island_of(node) * self.domain_stride
        return node * self.domain_stride + self.layout_of(node).domain_of[gpu]

    def leaf_group_of(self, node: int) -> int:
        return node // self.network.nodes_per_leaf

    def leaf_capacity_bytes_per_s(self, leaf_group: int, rail: int) -> float:
        """Total NIC line rate under one leaf (rail = -1 when the fabric is not rail-optimized).

        Its uplink to the spine carries this divided by ``network.oversubscription``.
        """
        key = (leaf_group, rail)
        capacity = self._leaf_capacity.get(key)
        if capacity is None:
            per_leaf = self.network.nodes_per_leaf
            first = leaf_group * per_leaf
            capacity = 0.0
            for node in range(first, min(first + per_leaf, self.num_nodes)):
                rates = self.layout_of(node).nic_rate_bytes_per_s
                if rail < 0:
                    capacity += sum(rates)
                elif rail < len(rates):
                    capacity += rates[rail]
            self._leaf_capacity[key] = capacity
        return capacity

    # ----- group queries --------------------------------------------------------------------------

    def group_link(
        self, slots: Sequence[int], concurrent: str | Sequence[Sequence[int]] = "all"
    ) -> GroupLink:
        """Bandwidth, latency and shape of one communicator; see ``placer.topology`` for rules.

        ``concurrent``: "all" (every GPU runs a translate of this group's collective at once),
        "alone" (only this group), or the other groups active at the same time.
        """
        key = tuple(sorted(int(s) for s in slots))
        if isinstance(concurrent, str):
            return self._query(key, concurrent)
        return group_link_of(analyze(self, key, concurrent))

    def _group_link_uncached(self, key: tuple[int, ...], concurrent: str) -> GroupLink:
        return group_link_of(analyze(self, key, concurrent))

    def ring_bottleneck(
        self, slots: Sequence[int], concurrent: Concurrency = "all"
    ) -> tuple[float, float, str]:
        """(bottleneck bytes/s per direction, summed step latency s, slowest link class) of the
        ring NCCL builds over the slots: grouped by node, nodes in order."""
        return ring_of(analyze(self, tuple(sorted(int(s) for s in slots)), concurrent))

    # ----- graph ----------------------------------------------------------------------------------

    @cached_property
    def graph(self) -> nx.Graph:
        """The hierarchical networkx graph (frozen); built on first use."""
        from placer.topology.graph import graph_of

        return graph_of(self)

    def gpu_vertex(self, slot: int) -> tuple[str, int, int]:
        node, gpu = self.locate(slot)
        return ("gpu", node, gpu)

    def path(self, a_slot: int, b_slot: int) -> list[PathHop]:
        """The route between two GPUs in the graph (for explanations and irregular clusters)."""
        from placer.topology.graph import route

        return route(self.graph, self.gpu_vertex(a_slot), self.gpu_vertex(b_slot))


_TOPOLOGIES: OrderedDict[int, tuple[Cluster, ClusterTopology]] = OrderedDict()


def topology_of(cluster: Cluster) -> ClusterTopology:
    """The cached topology of a cluster object (keyed by identity; clusters are immutable)."""
    entry = _TOPOLOGIES.get(id(cluster))
    if entry is not None and entry[0] is cluster:
        _TOPOLOGIES.move_to_end(id(cluster))
        return entry[1]
    topology = ClusterTopology(cluster)
    _TOPOLOGIES[id(cluster)] = (cluster, topology)
    while len(_TOPOLOGIES) > TOPOLOGY_CACHE_SIZE:
        _TOPOLOGIES.popitem(last=False)
    return topology


def build_graph(cluster: Cluster) -> nx.Graph:
    """The cluster as a frozen networkx graph (cached with the topology)."""
    return topology_of(cluster).graph
