"""Group link rules: the hops of a group's ring and the bandwidth each hop gets under load.

The rules (the cost model builds on them; ``placer.topology`` repeats them for users):

Ring order. NCCL builds rings grouped by node, nodes in order (slot order). Members of one
*island* talk without the network; an island is a node, or a whole NVLink domain when the domain
spans nodes (GB200 NVL72 trays). A group needs the network iff it spans more than one island.

Intra hops. Consecutive members of one island (and the wrap-around when the group is one island).
Two GPUs in one NVLink domain: NVLink line rate. Otherwise the hop is PCIe:
- same PCIe switch (PIX/PXB): the PCIe x16 rate (switch ports are not shared);
- different switches: the flows through each switch's single x16 uplink share it;
- different CPU sockets (SYS): the flows crossing sockets in that direction also share one
  inter-socket link, modelled at the node's PCIe x16 rate.
So SYS <= PHB <= PIX (the order of ``nvidia-smi topo -m`` and NCCL's path types, docs/sources.md
8.1 and 5.1). We found no sourced inter-socket rate, so the SYS link is not given a lower line rate
of its own; it is lower only through sharing.

Network. Each member sends through its NICs (``NIC.gpus``); a NIC's line rate (Gb/s / 8) is split
evenly among the concurrently active GPUs that use it, and the sum over a member's NICs is capped by
its own PCIe rate. Traffic that must climb to the spine (the group crosses leaf groups, or crosses
rails on a rail-optimized fabric) is divided by the leaf's congestion factor
``max(1, oversubscription * demand / capacity)``, where capacity is the total NIC rate under the
leaf and demand the rate of the active NICs under it whose groups climb; when every GPU is busy
("all") demand equals capacity, so the factor is exactly ``oversubscription``.

Concurrency. "alone": only this group's flows. "all": every GPU runs a translate of the group, so
a NIC is shared by all healthy GPUs using it, and a PCIe uplink or socket link carries this group's
flows scaled by (healthy GPUs under it / members under it). An explicit list: the flows of those
groups (each counted once; an exact copy of the query group is skipped) plus the query group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.topology.links import GroupLink, class_latency_s, slower_class

if TYPE_CHECKING:
    from placer.topology.cluster_topology import ClusterTopology
    from placer.topology.node_layout import NodeLayout

Concurrency = str | Sequence[Sequence[int]]
CONCURRENCY_MODES = ("all", "alone")


@dataclass
class _Footprint:
    """Where one group's members are, in ring order."""

    by_node: list[tuple[int, list[int]]]
    layouts: dict[int, NodeLayout]
    islands: list[list[tuple[int, list[int]]]]
    needs_network: bool
    crosses_leaf: bool
    rail_aligned: bool
    climbs: bool
    """Its network traffic goes through the spine (crosses leaf groups or rails)."""


@dataclass(frozen=True)
class Analysis:
    """Everything group_link and ring_bottleneck report, computed once."""

    topology: ClusterTopology
    size: int
    footprint: _Footprint
    hops: list[tuple[float, str]]
    member_shares: list[float]
    island_bytes_per_s: list[float]


def _footprint(topo: ClusterTopology, ordered: tuple[int, ...]) -> _Footprint:
    if not ordered:
        raise ValueError("a group needs at least one slot")
    if ordered[0] < 0 or ordered[-1] >= topo.num_gpus:
        raise IndexError(
            f"slots must be in 0..{topo.num_gpus - 1}; got {ordered[0]}..{ordered[-1]}")
    by_node: list[tuple[int, list[int]]] = []
    gpn = topo.uniform_gpus_per_node
    previous = -1
    for slot in ordered:
        if slot == previous:
            raise ValueError(f"slot {slot} appears twice in a group")
        previous = slot
        node, gpu = divmod(slot, gpn) if gpn else topo.locate(slot)
        if by_node and by_node[-1][0] == node:
            by_node[-1][1].append(gpu)
        else:
            by_node.append((node, [gpu]))
    layouts = {node: topo.layout_of(node) for node, _ in by_node}
    islands: list[list[tuple[int, list[int]]]] = []
    if topo.has_multinode_domains:
        last_island = -1
        for entry in by_node:
            island = topo.island_of(entry[0])
            if island == last_island:
                islands[-1].append(entry)
            else:
                islands.append([entry])
                last_island = island
    else:
        islands = [[entry] for entry in by_node]
    needs_network = len(islands) > 1
    network = topo.network
    rail_aligned = network.rail_optimized
    crosses_leaf = False
    if needs_network:
        per_leaf = network.nodes_per_leaf
        crosses_leaf = by_node[0][0] // per_leaf != by_node[-1][0] // per_leaf
        if rail_aligned:  # every island sends on the same rails (NICs at the same positions)
            rails = None
            for island in islands:
                used = frozenset(p for node, gpus in island
                                 for g in gpus for p in layouts[node].nics_of[g])
                if rails is None:
                    rails = used
                elif used != rails:
                    rail_aligned = False
                    break
    climbs = needs_network and (crosses_leaf or (network.rail_optimized and not rail_aligned))
    return _Footprint(by_node, layouts, islands, needs_network, crosses_leaf, rail_aligned, climbs)


def _island_hops(
    topo: ClusterTopology, fp: _Footprint
) -> list[tuple[int, int, int, int]]:
    """(node_a, gpu_a, node_b, gpu_b) for every intra-island step of the ring."""
    hops: list[tuple[int, int, int, int]] = []
    for island in fp.islands:
        members = [(node, g) for node, gpus in island for g in gpus]
        for (na, a), (nb, b) in zip(members, members[1:], strict=False):
            hops.append((na, a, nb, b))
        if not fp.needs_network and len(members) > 1:
            (na, a), (nb, b) = members[-1], members[0]
            hops.append((na, a, nb, b))
    return hops


def _is_pcie_hop(layout: NodeLayout, a: int, b: int) -> bool:
    return layout.domain_of[a] != layout.domain_of[b] and layout.switch_of[a] != layout.switch_of[b]


@dataclass
class _PcieLoad:
    """Flows per direction through each switch uplink and each socket-to-socket link."""

    out: dict[int, float]
    into: dict[int, float]
    sys: dict[tuple[int, int], float]


def _pcie_loads(
    topo: ClusterTopology, hop_lists: list[list[tuple[int, int, int, int]]], nodes: set[int]
) -> dict[int, _PcieLoad]:
    loads: dict[int, _PcieLoad] = {}
    for hops in hop_lists:
        for na, a, nb, b in hops:
            if na != nb or na not in nodes:
                continue
            layout = topo.layout_of(na)
            if not _is_pcie_hop(layout, a, b):
                continue
            load = loads.setdefault(na, _PcieLoad({}, {}, {}))
            sa, sb = layout.switch_of[a], layout.switch_of[b]
            load.out[sa] = load.out.get(sa, 0) + 1
            load.into[sb] = load.into.get(sb, 0) + 1
            ka, kb = layout.socket_of[a], layout.socket_of[b]
            if ka != kb:
                load.sys[ka, kb] = load.sys.get((ka, kb), 0) + 1
    return loads


def _scale_to_all(layout: NodeLayout, gpus: list[int], load: _PcieLoad) -> None:
    """Every GPU busy: this node's flows repeat once per translate sharing the link."""
    under: dict[int, int] = {}
    on: dict[int, int] = {}
    for g in gpus:
        under[layout.switch_of[g]] = under.get(layout.switch_of[g], 0) + 1
        on[layout.socket_of[g]] = on.get(layout.socket_of[g], 0) + 1
    for switch in load.out:
        load.out[switch] *= layout.healthy_per_switch[switch] / under[switch]
    for switch in load.into:
        load.into[switch] *= layout.healthy_per_switch[switch] / under[switch]
    for pair in load.sys:
        load.sys[pair] *= layout.healthy_per_socket[pair[0]] / on[pair[0]]


def _intra_hops(
    topo: ClusterTopology, fp: _Footprint, others: list[_Footprint], mode: str
) -> list[tuple[float, str]]:
    hops = _island_hops(topo, fp)
    layouts = fp.layouts
    pcie_nodes = {na for na, a, nb, b in hops if na == nb and _is_pcie_hop(layouts[na], a, b)}
    loads: dict[int, _PcieLoad] = {}
    if pcie_nodes:
        hop_lists = [hops] + [_island_hops(topo, o) for o in others]
        loads = _pcie_loads(topo, hop_lists, pcie_nodes)
        if mode == "all":
            gpus_on = dict(fp.by_node)
            for node, load in loads.items():
                _scale_to_all(layouts[node], gpus_on[node], load)
    out: list[tuple[float, str]] = []
    for na, a, nb, b in hops:
        layout = layouts[na]
        if na != nb:
            out.append((min(layout.nvlink_bytes_per_s, layouts[nb].nvlink_bytes_per_s),
                        "nvlink"))
        elif layout.domain_of[a] == layout.domain_of[b]:
            out.append((layout.nvlink_bytes_per_s, "nvlink"))
        elif layout.switch_of[a] == layout.switch_of[b]:
            out.append((layout.pcie_bytes_per_s, "pcie"))
        else:
            load = loads[na]
            sa, sb = layout.switch_of[a], layout.switch_of[b]
            flows = max(1.0, load.out[sa], load.into[sb])
            ka, kb = layout.socket_of[a], layout.socket_of[b]
            if ka != kb:
                flows = max(flows, load.sys[ka, kb])
            out.append((layout.pcie_bytes_per_s / flows, "pcie"))
    return out


def _nic_users(topo: ClusterTopology, fps: list[_Footprint]) -> dict[tuple[int, int], int]:
    """Active senders per (node, NIC) over the given network-using groups."""
    users: dict[tuple[int, int], int] = {}
    for fp in fps:
        if not fp.needs_network:
            continue
        for node, gpus in fp.by_node:
            nics_of = fp.layouts[node].nics_of
            for g in gpus:
                for nic in nics_of[g]:
                    users[node, nic] = users.get((node, nic), 0) + 1
    return users


def _leaf_factors(
    topo: ClusterTopology, climbing: list[_Footprint]
) -> dict[tuple[int, int], float]:
    """Congestion factor of every leaf (leaf group, rail or -1) the group's NICs climb from."""
    network = topo.network
    demand: dict[tuple[int, int], float] = {}
    seen: set[tuple[int, int]] = set()
    for other in climbing:
        for node, gpus in other.by_node:
            layout = other.layouts[node]
            for g in gpus:
                for nic in layout.nics_of[g]:
                    if (node, nic) in seen:
                        continue
                    seen.add((node, nic))
                    leaf = (topo.leaf_group_of(node), nic if network.rail_optimized else -1)
                    demand[leaf] = demand.get(leaf, 0.0) + layout.nic_rate_bytes_per_s[nic]
    factors = {}
    for leaf, rate in demand.items():
        capacity = topo.leaf_capacity_bytes_per_s(*leaf)
        factors[leaf] = max(1.0, network.oversubscription * rate / capacity)
    return factors


def _member_shares(
    topo: ClusterTopology, fp: _Footprint, others: list[_Footprint], mode: str
) -> tuple[list[float], list[float]]:
    """Each member's network bytes/s and each island's total, in ring order."""
    network = topo.network
    users = None if mode == "all" else _nic_users(topo, [fp, *others])
    uniform_factor = 1.0
    factors: dict[tuple[int, int], float] | None = None
    if fp.climbs and network.oversubscription > 1.0:
        if mode == "all":
            uniform_factor = network.oversubscription
        else:
            factors = _leaf_factors(topo, [fp, *(o for o in others if o.climbs)])
    shares: list[float] = []
    island_totals: list[float] = []
    for island in fp.islands:
        total = 0.0
        for node, gpus in island:
            layout = fp.layouts[node]
            leaf_group = topo.leaf_group_of(node)
            for g in gpus:
                rate = 0.0
                for nic in layout.nics_of[g]:
                    sharers = layout.nic_users[nic] if users is None else users[node, nic]
                    factor = uniform_factor
                    if factors is not None:
                        rail = nic if network.rail_optimized else -1
                        factor = factors[leaf_group, rail]
                    rate += layout.nic_rate_bytes_per_s[nic] / sharers / factor
                share = min(layout.pcie_bytes_per_s, rate)
                shares.append(share)
                total += share
        island_totals.append(total)
    return shares, island_totals


def analyze(topo: ClusterTopology, ordered: tuple[int, ...], concurrent: Concurrency) -> Analysis:
    """Apply the module's rules to the group ``ordered`` (sorted slots)."""
    if isinstance(concurrent, str):
        if concurrent not in CONCURRENCY_MODES:
            raise ValueError(f"concurrent must be 'all', 'alone' or a list of groups; "
                             f"got {concurrent!r}")
        mode, others = concurrent, []
    else:
        mode = "explicit"
        keys = {tuple(sorted(int(s) for s in group)) for group in concurrent}
        keys.discard(ordered)
        others = [_footprint(topo, key) for key in sorted(keys)]
    fp = _footprint(topo, ordered)
    hops = _intra_hops(topo, fp, others, mode)
    shares: list[float] = []
    islands: list[float] = []
    if fp.needs_network:
        shares, islands = _member_shares(topo, fp, others, mode)
    return Analysis(topo, len(ordered), fp, hops, shares, islands)


def _within_domain(a: Analysis) -> bool:
    fp = a.footprint
    if a.size == 1:
        return True
    if fp.needs_network:
        return False
    first_node = fp.by_node[0][0]
    if a.topology.spans_domain_nodes(first_node):
        return True
    if len(fp.by_node) > 1:
        return False
    domain_of = fp.layouts[first_node].domain_of
    return len({domain_of[g] for g in fp.by_node[0][1]}) == 1


def group_link_of(a: Analysis) -> GroupLink:
    """The GroupLink record of an analysed group."""
    fp, topo = a.footprint, a.topology
    intra_class = "local"
    for _, link_class in a.hops:
        intra_class = slower_class(intra_class, link_class)
    within = _within_domain(a)
    fabric = fp.layouts[fp.by_node[0][0]].node_type.fabric
    if a.size == 1:
        link_class = "local"
    elif fp.needs_network:
        link_class = "network"
    else:
        link_class = intra_class
    return GroupLink(
        size=a.size,
        num_nodes=len(fp.by_node),
        max_gpus_per_node=max(len(gpus) for _, gpus in fp.by_node),
        within_nvlink_domain=within,
        link_class=link_class,
        intra_bytes_per_s=min((bw for bw, _ in a.hops), default=math.inf),
        inter_bytes_per_s=min(a.member_shares, default=math.inf),
        node_inter_bytes_per_s=min(a.island_bytes_per_s, default=math.inf),
        intra_latency_s=class_latency_s(topo.latency, intra_class),
        inter_latency_s=topo.latency.network_s if fp.needs_network else 0.0,
        nvls=within and a.size > 2 and fabric.kind == "nvswitch" and fabric.nvls,
        crosses_leaf=fp.crosses_leaf,
        rail_aligned=fp.rail_aligned,
    )


def ring_of(a: Analysis) -> tuple[float, float, str]:
    """(bottleneck bytes/s, summed latency s, slowest class) of the group's ring.

    A network step out of an island gets the island's total share: NCCL runs one ring channel
    per NIC, so the ring across islands is bounded by NICs per node x per-NIC rate
    (docs/sources.md section 4, derived rule).
    """
    if a.size == 1:
        return math.inf, 0.0, "local"
    latency = a.topology.latency
    steps = list(a.hops) + [(bw, "network") for bw in a.island_bytes_per_s]
    bottleneck = min(bw for bw, _ in steps)
    total_latency = sum(class_latency_s(latency, link_class) for _, link_class in steps)
    slowest = "local"
    for _, link_class in steps:
        slowest = slower_class(slowest, link_class)
    return bottleneck, total_latency, slowest
