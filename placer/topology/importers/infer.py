"""Turn a ``HostTopology`` into a placer ``NodeType``, saying what had to be assumed.

Rules (each also applies to both input formats):

- Fabric: every GPU pair NVLinked -> ``nvswitch`` (all-to-all NVLink); NVLink only inside groups
  -> ``nvlink_bridge`` with those groups (cliques of the NVLink graph); none -> ``pcie``.
  On a switched board nvidia-smi prints each GPU's whole link count for every pair (NV12 on DGX
  A100), so an all-pairs count that a GPU could not have to each peer separately means switches;
  otherwise the links are direct and a GPU's links are the sum over its peers.
- NVLink bandwidth per GPU and direction = links x the GPU's per-link rate (``gpu_links.py``).
- ``pcie_switch_groups``: GPUs joined by PIX/PXB, or both PIX/PXB to the same NIC.
- ``numa_groups``: GPUs joined by PIX/PXB/PHB/NODE, a NIC both reach without SYS, or the same
  NUMA Affinity; left empty when NVLink hides how some GPUs relate.
- NICs: each NIC with a GPU at PIX/PXB serves the GPUs of its PCIe island, one GPU per NIC where
  the counts match (NIC k of an island -> its k-th GPU), else GPUs split evenly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer.errors import InputError, PlacerError
from placer.spec.cluster import NodeType
from placer.spec.gpu import GPU
from placer.spec.presets import gpu_names, gpu_preset, preset_name, unknown_preset, validated
from placer.topology.importers.gpu_links import (
    GPU_BY_SM,
    GPU_LINKS,
    GRACE_GPU_BY_SM,
    GpuLinks,
    gpu_links,
)
from placer.topology.importers.host import SAME_NUMA, SAME_SWITCH, HostTopology

# Used when the file gives no NIC rate (nvidia-smi topo -m never does): NDR InfiniBand, the rate
# of DGX H100/B200 compute ports (docs/sources.md 5.1-5.2).
DEFAULT_NIC_RATE_GBPS = 400.0


@dataclass(frozen=True)
class ImportedNode:
    """A node type read from a topology file, and what placer had to assume to build it."""

    node_type: NodeType
    notes: tuple[str, ...]
    source_format: str
    network_kind: str
    """Cluster network kind the NICs suggest: infiniband, roce or none."""
    network_kind_assumed: bool
    """True when the file does not say InfiniBand or Ethernet (nvidia-smi topo -m)."""


def choose_gpu(host: HostTopology, gpu_name: str | None) -> tuple[GPU, list[str]]:
    """The ``--gpu`` preset, or the GPU the XML's ``sm`` names; notes say what was guessed."""
    if gpu_name is not None:
        given, gpu_name = gpu_name, preset_name(gpu_name, gpu_names())
        if gpu_name is None:
            raise unknown_preset("--gpu", given, list(GPU_LINKS), or_file=False)
        links = gpu_links(gpu_name)
        if host.sm is not None and host.sm != links.sm:
            raise InputError("--gpu", gpu_name, f"it is sm {links.sm} but the file's GPUs are "
                             f"sm {host.sm}; pick a GPU of that generation")
        return gpu_preset(gpu_name), []
    if host.sm is None:
        raise PlacerError(f"--gpu is required: {host.source_format} does not name the GPU; use "
                          f"one of {', '.join(GPU_LINKS)}")
    table = GRACE_GPU_BY_SM if host.grace and host.sm in GRACE_GPU_BY_SM else GPU_BY_SM
    if host.sm not in table:
        raise PlacerError(f"--gpu is required: placer cannot tell the GPU from sm {host.sm}; use "
                          f"one of {', '.join(GPU_LINKS)}")
    name = table[host.sm]
    same_sm = [g for g in GPU_LINKS if GPU_LINKS[g].sm == host.sm and g != name]
    others = f" ({', '.join(same_sm)} also has it)" if same_sm else ""
    return gpu_preset(name), [
        f"GPU {name} assumed from sm {host.sm}{others}; memory size cannot be read from topology "
        "files, so pass --gpu if that is wrong"
    ]


def node_type_from_host(host: HostTopology, name: str, source: str, gpu_name: str | None = None,
                        nic_rate_gbps: float | None = None) -> ImportedNode:
    """Build and validate the node type; every assumption becomes a note."""
    gpu, notes = choose_gpu(host, gpu_name)
    notes += list(host.notes)
    links = gpu_links(gpu.name)
    fabric = _fabric(host, gpu.name, links, notes)
    nics, transports = _nics(host, nic_rate_gbps, notes)
    node_type = validated(NodeType, {"name": name, "gpu": gpu, "gpus_per_node": host.num_gpus,
                                     "fabric": fabric, "nics": nics}, source)
    if not nics:
        network = "none"
    elif transports == {"ethernet"}:
        network = "roce"  # RDMA NICs (they have <net> devices for NCCL) on Ethernet
    else:
        network = "infiniband"
    return ImportedNode(node_type=node_type, notes=tuple(notes),
                        source_format=host.source_format, network_kind=network,
                        network_kind_assumed=bool(nics) and None in transports)


def _fabric(host: HostTopology, gpu: str, links: GpuLinks, notes: list[str]) -> dict[str, Any]:
    n = host.num_gpus
    kind, groups, per_gpu_links, switched = _nvlink_structure(host, links)
    fields: dict[str, Any] = {"kind": kind, "nvlink_groups": groups}
    if kind != "pcie":
        if links.nvlink_generation is None:
            raise InputError("--gpu", gpu, f"the file shows NVLink but a {gpu} has none; pass the "
                             "GPU this server has")
        if per_gpu_links > links.nvlink_links:
            raise InputError("--gpu", gpu, f"the file shows {per_gpu_links} NVLinks per GPU but a "
                             f"{gpu} has {links.nvlink_links} (NVLink{links.nvlink_generation}); "
                             "pass the GPU this server has")
        fields.update(
            nvlink_generation=links.nvlink_generation,
            nvlink_bandwidth_bytes_per_s=per_gpu_links * links.nvlink_link_bytes_per_s,
            # NVLink SHARP needs 3rd-gen NVSwitches: Hopper and later (spec: IntraNodeFabric.nvls).
            nvls=switched and links.nvlink_generation >= 4,
        )
        if kind == "nvswitch":
            fields["nvlink_domain_size"] = n
    if host.multi_node_nvlink:
        notes.append("NVLink reaches other nodes (a rack-scale domain such as GB200 NVL72): set "
                     "fabric.nvlink_domain_size to the rack's GPU count")
    if host.pcie_bytes_per_s is not None:
        fields["pcie_bandwidth_bytes_per_s"] = host.pcie_bytes_per_s
    else:
        fields["pcie_bandwidth_bytes_per_s"] = links.pcie_bytes_per_s
        notes.append(f"PCIe: {links.pcie_bytes_per_s / 1e9:g} GB/s per direction assumed, the "
                     f"x16 link of the {gpu} (the file gives no link speeds)")
    fields["pcie_switch_groups"] = _switch_groups(host)
    fields["numa_groups"] = _numa_groups(host, notes)
    return fields


def _nvlink_structure(host: HostTopology,
                      links: GpuLinks) -> tuple[str, list[list[int]], int, bool]:
    """(kind, nvlink_groups, NVLinks per GPU, through NVSwitches)."""
    n, nv = host.num_gpus, host.nvlinks
    if host.nvswitch_links is not None:
        if min(host.nvswitch_links) == 0:
            raise PlacerError(f"{host.source_format}: only some GPUs have NVSwitch links; "
                              "placer needs all or none")
        return "nvswitch", [], min(host.nvswitch_links), True
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    linked = [(i, j) for i, j in pairs if nv[i][j]]
    if not linked:
        return "pcie", [], 0, False
    if len(linked) == len(pairs):
        counts = {nv[i][j] for i, j in pairs}
        count = min(counts)
        if len(counts) == 1 and count * (n - 1) > max(links.nvlink_links, count):
            return "nvswitch", [], count, True
        return "nvswitch", [], min(sum(row) for row in nv), False
    groups = _cliques(n, nv)
    per_gpu = min(sum(nv[g][h] for h in group) for group in groups for g in group)
    return "nvlink_bridge", groups, per_gpu, False


def _cliques(n: int, nv: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """Greedy, deterministic split of the NVLink graph into fully linked groups of 2 or more."""
    taken: set[int] = set()
    groups = []
    for g in range(n):
        if g in taken:
            continue
        group = [g]
        for h in range(g + 1, n):
            if h not in taken and all(nv[h][k] for k in group):
                group.append(h)
        if len(group) > 1:
            groups.append(group)
            taken.update(group)
    return groups


class _Union:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            a = self.parent[a]
        return a

    def join(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        self.parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for g in range(len(self.parent)):
            out.setdefault(self.find(g), []).append(g)
        return sorted(out.values())


def _joined(host: HostTopology, close: frozenset[str]) -> _Union:
    """GPUs joined when their PCIe relation, or their relations to one NIC, are in ``close``."""
    union = _Union(host.num_gpus)
    for i in range(host.num_gpus):
        for j in range(host.num_gpus):
            if host.pcie[i][j] in close:
                union.join(i, j)
    for nic in host.nics:
        near = [g for g, rel in enumerate(nic.relation) if rel in close]
        for g in near[1:]:
            union.join(near[0], g)
    return union


def _switch_groups(host: HostTopology) -> list[list[int]]:
    """GPUs under one PCIe switch tree; empty when the file shows no PIX/PXB at all."""
    seen = any(rel in SAME_SWITCH for row in host.pcie for rel in row) or any(
        rel in SAME_SWITCH for nic in host.nics for rel in nic.relation
    )
    return _joined(host, SAME_SWITCH).groups() if seen else []


def _numa_groups(host: HostTopology, notes: list[str]) -> list[list[int]]:
    """GPUs on one NUMA node, when the file settles it for every pair."""
    n = host.num_gpus
    if n == 1:
        return []
    union = _joined(host, SAME_NUMA)
    for i in range(n):
        for j in range(n):
            if host.numa[i] is not None and host.numa[i] == host.numa[j]:
                union.join(i, j)
    groups = union.groups()
    apart = {(union.find(i), union.find(j)) for i in range(n) for j in range(n)
             if host.pcie[i][j] == "SYS" or (None not in (host.numa[i], host.numa[j])
                                             and host.numa[i] != host.numa[j])}
    roots = [union.find(group[0]) for group in groups]
    unsettled = [(a, b) for a in roots for b in roots if a < b and (a, b) not in apart]
    if unsettled:
        notes.append("NUMA: NVLink hides how some GPUs connect to the CPUs and there is no NUMA "
                     "affinity for them; numa_groups left empty (one socket)")
        return []
    return groups


def _nics(host: HostTopology, rate_gbps: float | None,
          notes: list[str]) -> tuple[list[dict[str, Any]], set[str | None]]:
    """NICs under a PCIe switch with GPUs, each with the GPUs it serves, in GPU order; and
    their transports."""
    served = _nic_assignment(host)
    kept = [k for k in range(len(host.nics)) if served[k]]
    skipped = [host.nics[k].name for k in range(len(host.nics)) if not served[k]]
    if skipped:
        notes.append(f"NICs with no GPU under their PCIe switch left out (storage or management): "
                     f"{', '.join(skipped)}")
    file_rates = [host.nics[k].rate_gbps for k in kept]
    if rate_gbps is not None and any(r is not None for r in file_rates):
        notes.append(f"NIC rate: {rate_gbps:g} Gb/s from --nic-rate-gbps instead of the file's")
    elif rate_gbps is None and kept and any(r is None for r in file_rates):
        notes.append(f"NIC rate: the file gives none; {DEFAULT_NIC_RATE_GBPS:g} Gb/s assumed "
                     "(set it with --nic-rate-gbps)")
    nics = [
        {"name": host.nics[k].name, "gpus": served[k],
         "rate_gbps": rate_gbps or host.nics[k].rate_gbps or DEFAULT_NIC_RATE_GBPS}
        for k in sorted(kept, key=lambda k: (served[k][0], k))
    ]
    return nics, {host.nics[k].transport for k in kept}


def _nic_assignment(host: HostTopology) -> list[list[int]]:
    """The GPUs each NIC serves: the GPUs of its PIX/PXB island, shared out among its NICs."""
    nic_count = len(host.nics)
    union = _Union(host.num_gpus + nic_count)
    for k, nic in enumerate(host.nics):
        for g, rel in enumerate(nic.relation):
            if rel in SAME_SWITCH:
                union.join(g, host.num_gpus + k)
    served: list[list[int]] = [[] for _ in range(nic_count)]
    for island in union.groups():
        gpus = [m for m in island if m < host.num_gpus]
        nics = [m - host.num_gpus for m in island if m >= host.num_gpus]
        if not gpus or not nics:
            continue
        for position, k in enumerate(nics):
            if len(nics) >= len(gpus):
                served[k] = [gpus[position * len(gpus) // len(nics)]]
            else:
                lo, hi = (position * len(gpus) // len(nics),
                          (position + 1) * len(gpus) // len(nics))
                served[k] = gpus[lo:hi]
    return served
