"""The cluster as a graph, and fast link queries for the cost model and the solver.

``topology_of(cluster)`` gives a cached ``ClusterTopology``: healthy GPUs as *slots* (torchrun
ranks under the natural launch: nodes in order, local GPUs ascending), and
``group_link(slots, concurrent)`` / ``ring_bottleneck(slots)`` in O(group size + NICs of the
spanned nodes). ``build_graph(cluster)`` gives the networkx graph (built lazily, cached) used by
``path`` for explanations. The bandwidth rules are written out in ``placer.topology.groups``;
the graph's edges come from the same per-node tables (``node_layout``).

Conventions the cost model can rely on:
- every bandwidth is per GPU (or per node for ``node_inter_bytes_per_s``) per direction, bytes/s;
  NIC line rates are Gb/s / 8; math.inf means "this hop is not used";
- a bandwidth of 0.0 means unreachable (a group that needs the network on nodes without NICs);
- an *island* is a node, or a whole NVLink domain spanning nodes (GB200 NVL72); a group needs the
  network iff it spans islands. ``num_nodes`` / ``max_gpus_per_node`` count OS nodes (trays),
  while ``node_inter_bytes_per_s`` is the total out of the most constrained island.
"""

from placer.topology.cluster_topology import ClusterTopology, build_graph, topology_of
from placer.topology.groups import Concurrency
from placer.topology.links import LINK_CLASS_ORDER, GroupLink, PathHop, slower_class
from placer.topology.node_layout import NodeLayout

__all__ = [
    "LINK_CLASS_ORDER", "ClusterTopology", "Concurrency", "GroupLink", "NodeLayout", "PathHop",
    "build_graph", "slower_class", "topology_of",
]
