"""Per-node lookup tables derived once from a node type and its excluded GPUs.

Both the graph builder and the fast group queries read these tables, so the two always agree on
which GPUs share an NVLink domain, a PCIe switch, a CPU socket or a NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.spec.cluster import NodeType


@dataclass(frozen=True)
class NodeLayout:
    """Who shares what inside one node (indices are local GPU indices, NIC list positions).

    Rules for incomplete descriptions (documented because the cost model inherits them):
    - a GPU in no ``pcie_switch_groups`` entry has a switch of its own (its own x16 link);
    - a GPU in no ``numa_groups`` entry is on socket 0 (one socket when the list is empty);
    - a switch belongs to the socket of its first GPU;
    - a GPU that no NIC lists reaches every NIC of the node (NCCL picks among them);
    - ``network.kind == "none"`` means the node has no usable NIC.
    """

    node_type: NodeType
    healthy: tuple[int, ...]
    domain_of: tuple[int, ...]
    """Local NVLink domain of each GPU: equal values are joined by NVLink inside the node."""
    num_local_domains: int
    switch_of: tuple[int, ...]
    switch_socket: tuple[int, ...]
    socket_of: tuple[int, ...]
    nics_of: tuple[tuple[int, ...], ...]
    """NIC positions (rails) each GPU sends through."""
    nic_rate_bytes_per_s: tuple[float, ...]
    healthy_per_switch: tuple[int, ...]
    healthy_per_socket: tuple[int, ...]
    nic_users: tuple[int, ...]
    """Healthy GPUs that send through each NIC: the sharers when every GPU is busy."""
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float

    @property
    def gpus_per_node(self) -> int:
        return self.node_type.gpus_per_node

    @property
    def num_sockets(self) -> int:
        return len(self.healthy_per_socket)


def nvlink_nodes_per_domain(node_type: NodeType) -> int:
    """Nodes sharing one NVLink domain: >1 only for NVSwitch domains that span nodes (NVL72)."""
    fabric = node_type.fabric
    if fabric.kind != "nvswitch" or not fabric.nvlink_domain_size:
        return 1
    return max(1, fabric.nvlink_domain_size // node_type.gpus_per_node)


def _local_domains(node_type: NodeType) -> tuple[tuple[int, ...], int]:
    fabric, n = node_type.fabric, node_type.gpus_per_node
    if fabric.kind == "pcie":
        return tuple(range(n)), n
    if fabric.kind == "nvswitch":
        size = min(fabric.nvlink_domain_size or n, n)
        return tuple(g // size for g in range(n)), -(-n // size)
    domain = [-1] * n
    for index, group in enumerate(fabric.nvlink_groups):
        for g in group:
            if domain[g] < 0:
                domain[g] = index
    count = len(fabric.nvlink_groups)
    for g in range(n):
        if domain[g] < 0:
            domain[g], count = count, count + 1
    return tuple(domain), count


def _membership(groups: list[list[int]], n: int, default_own: bool) -> tuple[int, ...]:
    """Index of the first group holding each GPU; unlisted GPUs get their own index or 0."""
    owner = [-1] * n
    for index, group in enumerate(groups):
        for g in group:
            if owner[g] < 0:
                owner[g] = index
    count = len(groups)
    for g in range(n):
        if owner[g] < 0:
            if default_own:
                owner[g], count = count, count + 1
            else:
                owner[g] = 0
    return tuple(owner)


def node_layout(node_type: NodeType, healthy: tuple[int, ...], network: bool) -> NodeLayout:
    """Build the tables for one node type with the given healthy GPUs."""
    n = node_type.gpus_per_node
    fabric = node_type.fabric
    domain_of, num_domains = _local_domains(node_type)
    switch_of = _membership(fabric.pcie_switch_groups, n, default_own=True)
    socket_of = _membership(fabric.numa_groups, n, default_own=False)
    num_switches = max(switch_of) + 1
    switch_socket = [0] * num_switches
    for g in range(n - 1, -1, -1):
        switch_socket[switch_of[g]] = socket_of[g]
    nics = node_type.nics if network else []
    everyone = tuple(range(len(nics)))
    listed: list[list[int]] = [[] for _ in range(n)]
    for position, nic in enumerate(nics):
        for g in nic.gpus:
            if position not in listed[g]:
                listed[g].append(position)
    nics_of = tuple(tuple(sorted(p)) if p else everyone for p in listed)
    per_switch, per_socket = [0] * num_switches, [0] * (max(socket_of) + 1)
    users = [0] * len(nics)
    for g in healthy:
        per_switch[switch_of[g]] += 1
        per_socket[socket_of[g]] += 1
        for position in nics_of[g]:
            users[position] += 1
    return NodeLayout(
        node_type=node_type,
        healthy=healthy,
        domain_of=domain_of,
        num_local_domains=num_domains,
        switch_of=switch_of,
        switch_socket=tuple(switch_socket),
        socket_of=socket_of,
        nics_of=nics_of,
        nic_rate_bytes_per_s=tuple(nic.rate_bytes_per_s for nic in nics),
        healthy_per_switch=tuple(per_switch),
        healthy_per_socket=tuple(per_socket),
        nic_users=tuple(users),
        nvlink_bytes_per_s=fabric.nvlink_bandwidth_bytes_per_s or 0.0,
        pcie_bytes_per_s=fabric.pcie_bandwidth_bytes_per_s,
    )
