"""The rules of ``placer check``: ids, severities, and the group rules over a placed layout.

Each rule fires at most once per config (per plan candidate), naming the first offending group,
its ranks and nodes, and how many other groups share the problem: a TP=16 job has dozens of bad
TP groups and one line per group would bury the message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from placer.check.findings import Finding, Severity
from placer.mesh import MeshGrid, order_text
from placer.spec.cluster import NodeType
from placer.topology import ClusterTopology


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("tp-cross-node", "error",
         "a TP group spans nodes outside one NVLink domain: per-layer collectives go over the "
         "network"),
    Rule("tp-outside-nvlink", "error",
         "a TP group stays in one node but leaves its NVLink domain (NVLink-bridge pairs)"),
    Rule("tp-pcie-only", "info",
         "TP runs over PCIe because the nodes have no NVLink (the best these nodes allow)"),
    Rule("ep-outside-nvlink", "warning",
         "an EP group leaves its NVLink domain: token all-to-alls go over PCIe or the network"),
    Rule("cp-cross-node", "warning",
         "a CP group spans nodes outside one NVLink domain"),
    Rule("pp-far-apart", "info",
         "neighbouring pipeline stages sit under different leaf switches (through the spine)"),
    Rule("degrees-cluster", "error",
         "degrees do not multiply to or divide the world size, or the launch does not fit the "
         "cluster's nodes"),
    Rule("degrees-model", "error",
         "degrees do not divide the model or batch (heads, layers, experts, sequence, batch)"),
    Rule("framework-refuses", "error",
         "the framework refuses this combination of settings when it starts (its check named)"),
    Rule("memory-over-capacity", "error",
         "predicted peak memory of the worst pipeline stage exceeds usable GPU memory"),
    Rule("rank-map-torchrun", "error",
         "a plan's rank map puts a rank on another node or local rank than torchrun assigns"),
    Rule("rank-map-invalid", "error",
         "a plan's rank map is not one rank per healthy GPU with a complete grid of coordinates"),
    Rule("setting-unresolved", "warning",
         "a parallel degree is known only when the job runs (a variable the scheduler or the "
         "caller sets, a branch on one): the layout checks were skipped"),
    Rule("world-size-unknown", "warning",
         "the world size is neither in the file nor given (--nodes): the rules that need it "
         "were skipped and are named"),
    Rule("model-unknown", "warning",
         "the model is neither in the file nor given (--model): divisibility by heads, layers "
         "and experts and the memory check were skipped"),
    Rule("no-parallel-settings", "info",
         "the file was read but holds no parallel settings, so nothing was checked"),
)}


def finding(rule_id: str, message: str, file: str, line: int | None = None, *,
            group: str | None = None, ranks: Sequence[int] = (), nodes: Sequence[int] = (),
            candidate: int | None = None, severity: Severity | None = None) -> Finding:
    """A Finding of a registered rule (severity from the registry unless overridden)."""
    rule = RULES[rule_id]
    return Finding(rule_id=rule.id, severity=severity or rule.severity, message=message,
                   file=file, line=line, group=group, ranks=list(ranks), nodes=list(nodes),
                   candidate=candidate)


def span(values: Sequence[int]) -> str:
    """``0-7``, ``0,8,16,24`` or ``0-3,8-11``: a short rendering of sorted integers."""
    items = sorted(values)
    if not items:
        return ""
    steps = {b - a for a, b in zip(items, items[1:], strict=False)}
    if len(items) > 2 and len(steps) == 1 and steps != {1}:
        step = steps.pop()
        return f"{items[0]},{items[1]},...,{items[-1]} (every {step})"
    parts, start, prev = [], items[0], items[0]
    for value in items[1:] + [None]:  # type: ignore[list-item]
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


@dataclass(frozen=True)
class Placed:
    """A layout's grid with, for each logical index, its global rank and the slot it runs on."""

    grid: MeshGrid
    rank_of: tuple[int, ...]
    slot_of: tuple[int, ...]
    topology: ClusterTopology
    file: str
    lines: dict[str, int]
    candidate: int | None = None
    allow_tp_outside_nvlink: bool = False

    def groups(self, dim: str) -> list[tuple[list[int], list[int]]]:
        """Groups of ``dim`` of size > 1 as (ranks, slots), in logical order."""
        out = []
        for members in self.grid.groups(dim):
            if len(members) > 1:
                out.append(([self.rank_of[i] for i in members],
                            [self.slot_of[i] for i in members]))
        return out

    def line(self, *keys: str) -> int | None:
        return next((self.lines[k] for k in keys if k in self.lines), None)


_NETWORK_NAMES = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet",
                  "none": "(missing) network"}


def _fast_domain(node_type: NodeType) -> tuple[int, str, str]:
    """(GPUs a TP group may span, what joins them, node type name): the NVLink domain, or the
    whole node on PCIe-only nodes (the best those allow)."""
    if node_type.fabric.kind == "pcie":
        return node_type.gpus_per_node, "PCIe inside a node", node_type.name
    return node_type.nvlink_domain_size, "NVLink", node_type.name


def _node_type_of(topology: ClusterTopology, slot: int) -> NodeType:
    return topology.layout_of(topology.node_of(slot)).node_type


def _is_pcie_only(topology: ClusterTopology, slots: Sequence[int]) -> bool:
    nodes = topology.nodes_of(slots)
    return all(topology.layout_of(n).node_type.fabric.kind == "pcie" for n in nodes)


def _first_and_count(items: list[tuple[list[int], list[int]]],
                     bad: Callable[[list[int]], bool]) -> tuple[tuple[list[int], list[int]] | None,
                                                                int]:
    hits = [item for item in items if bad(item[1])]
    return (hits[0] if hits else None), len(hits)


def _more(count: int, dim: str) -> str:
    return f" (and {count - 1} more {dim.upper()} group{'s' if count > 2 else ''})" \
        if count > 1 else ""


def tp_rules(placed: Placed) -> list[Finding]:
    topo = placed.topology
    groups = placed.groups("tp")
    if not groups:
        return []
    found: list[Finding] = []
    cross, bridge, pcie = [], [], []
    for group in groups:
        if topo.group_link(group[1], "alone").within_nvlink_domain:
            continue
        if topo.spans_nodes(group[1]):
            cross.append(group)
        elif _is_pcie_only(topo, group[1]):
            pcie.append(group)
        else:
            bridge.append(group)
    if not (cross or bridge or pcie):
        return []
    first_slot = (cross or bridge or pcie)[0][1][0]
    domain, fast, node_type = _fast_domain(_node_type_of(topo, first_slot))
    tp = placed.grid.layout.tp
    order = order_text(placed.grid.order)
    reorder = tp <= domain and placed.grid.order[0] != "tp"
    hint = (f"tp={tp} fits in {domain} GPUs joined by {fast}: put tp innermost in the rank "
            f"order (tp-cp-dp-pp), not {order}" if reorder
            else f"keep tp <= {domain} ({node_type} GPUs joined by {fast})")
    severity: Severity | None = "warning" if placed.allow_tp_outside_nvlink else None
    line = placed.line("order", "tp") if reorder else placed.line("tp", "order")
    net = _NETWORK_NAMES[topo.cluster.network.kind]

    def message(rule: str, ranks: list[int], slots: list[int], nodes: list[int]) -> str:
        if rule == "tp-cross-node":
            return (f"TP group of ranks {span(ranks)} spans nodes {span(nodes)}: its per-layer "
                    f"collectives would cross the {net} network instead of {fast}; {hint}")
        if rule == "tp-outside-nvlink":
            return (f"TP group of ranks {span(ranks)} on node {span(nodes)} leaves its NVLink "
                    f"domain (GPUs {span([topo.locate(s)[1] for s in slots])}); part of each "
                    f"collective goes over PCIe; {hint}")
        return (f"TP group of ranks {span(ranks)} on node {span(nodes)} runs over PCIe: "
                f"{node_type} nodes have no NVLink, so this is the best they allow")

    kinds = (("tp-cross-node", cross, severity), ("tp-outside-nvlink", bridge, severity),
             ("tp-pcie-only", pcie, None))
    for rule, members, rule_severity in kinds:
        if not members:
            continue
        ranks, slots = members[0]
        nodes = topo.nodes_of(slots)
        found.append(finding(
            rule, message(rule, ranks, slots, nodes) + _more(len(members), "tp"),
            placed.file, line, group="tp", ranks=ranks, nodes=nodes,
            candidate=placed.candidate, severity=rule_severity))
    return found


def ep_rule(placed: Placed) -> list[Finding]:
    topo = placed.topology
    first, count = _first_and_count(
        placed.groups("ep"), lambda s: not topo.group_link(s, "alone").within_nvlink_domain)
    if first is None:
        return []
    ranks, slots = first
    nodes = topo.nodes_of(slots)
    where = (f"spans nodes {span(nodes)}" if len(nodes) > 1
             else f"on node {span(nodes)} is not NVLink-connected")
    domain, fast, _ = _fast_domain(_node_type_of(topo, slots[0]))
    limit = (f"ep*etp <= {domain} keeps it on {fast}" if fast == "NVLink"
             else "these nodes have no NVLink")
    return [finding(
        "ep-outside-nvlink",
        f"EP group of ranks {span(ranks)} {where}: every MoE layer's token all-to-all leaves "
        f"NVLink; {limit}{_more(count, 'ep')}",
        placed.file, placed.line("ep", "order"), group="ep", ranks=ranks, nodes=nodes,
        candidate=placed.candidate)]


def cp_rule(placed: Placed) -> list[Finding]:
    topo = placed.topology

    def bad(slots: list[int]) -> bool:
        return topo.spans_nodes(slots) and not topo.group_link(slots, "alone").within_nvlink_domain

    first, count = _first_and_count(placed.groups("cp"), bad)
    if first is None:
        return []
    ranks, slots = first
    nodes = topo.nodes_of(slots)
    return [finding(
        "cp-cross-node",
        f"CP group of ranks {span(ranks)} spans nodes {span(nodes)}: its K/V exchange in every "
        f"attention layer crosses the network; keep tp*cp within a node{_more(count, 'cp')}",
        placed.file, placed.line("cp", "order"), group="cp", ranks=ranks, nodes=nodes,
        candidate=placed.candidate)]


def pp_rule(placed: Placed) -> list[Finding]:
    topo = placed.topology
    pairs: list[tuple[list[int], list[int]]] = []
    for ranks, slots in placed.groups("pp"):
        for i in range(len(slots) - 1):
            pair = ([ranks[i], ranks[i + 1]], [slots[i], slots[i + 1]])
            if topo.group_link(pair[1], "alone").crosses_leaf:
                pairs.append(pair)
    if not pairs:
        return []
    ranks, slots = pairs[0]
    nodes = topo.nodes_of(slots)
    leaves = sorted({topo.leaf_group_of(n) for n in nodes})
    more = f" (and {len(pairs) - 1} more stage pairs)" if len(pairs) > 1 else ""
    return [finding(
        "pp-far-apart",
        f"pipeline neighbours ranks {ranks[0]} and {ranks[1]} (nodes {span(nodes)}) sit under "
        f"leaf switches {span(leaves)}: stage-to-stage sends cross the spine{more}",
        placed.file, placed.line("pp", "order"), group="pp", ranks=ranks, nodes=nodes,
        candidate=placed.candidate)]


GROUP_RULES: tuple[Callable[[Placed], list[Finding]], ...] = (tp_rules, ep_rule, cp_rule,
                                                               pp_rule)


def group_findings(placed: Placed) -> list[Finding]:
    """Every group rule over one placed layout."""
    out: list[Finding] = []
    for rule in GROUP_RULES:
        out.extend(rule(placed))
    return out
