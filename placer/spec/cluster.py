"""Cluster description: node types, intra-node fabric, NICs and rails, network, irregular nodes.

A cluster is a list of node pools (``count`` nodes of one node type each), so mixed clusters (A100
and H100 nodes in one job) are two pools. Failed or excluded GPUs are listed by (node, gpu); the
rest of placer sees only healthy GPUs.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from placer.errors import InputError
from placer.spec.base import MIN_BYTES_PER_S, Spec
from placer.spec.gpu import GPU

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+-]*$"
HOSTNAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$"
IFNAME_PATTERN = r"^[\^=]{0,2}[A-Za-z0-9_.:-]+(,[\^=]{0,2}[A-Za-z0-9_.:-]+)*$"


class IntraNodeFabric(Spec):
    """How the GPUs of one node (or one NVLink domain) talk to each other."""

    kind: Literal["nvswitch", "nvlink_bridge", "pcie"] = Field(
        description="nvswitch: all-to-all NVLink; nvlink_bridge: NVLink only inside nvlink_groups; "
        "pcie: no NVLink"
    )
    nvlink_generation: int | None = Field(default=None, ge=1, le=6)
    nvlink_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BYTES_PER_S, description="NVLink line rate per GPU per direction"
    )
    nvlink_domain_size: int | None = Field(
        default=None,
        ge=1,
        description="GPUs in one NVLink domain: 8 on DGX/HGX, 72 on GB200 NVL72 (spans nodes)",
    )
    nvls: bool = Field(default=False, description="NVLink SHARP (3rd-gen NVSwitch and Hopper+)")
    nvlink_groups: list[list[int]] = Field(
        default_factory=list, description="for nvlink_bridge: local GPU indices joined by NVLink"
    )
    pcie_bandwidth_bytes_per_s: float = Field(
        ge=MIN_BYTES_PER_S,
        description="PCIe rate per GPU per direction (Gen4 x16: 32e9, Gen5 x16: 64e9)"
    )
    host_bandwidth_bytes_per_s: float | None = Field(
        default=None, ge=MIN_BYTES_PER_S,
        description="GPU to host memory per GPU per direction (activation offload); default the "
        "PCIe rate; Grace systems reach it over NVLink-C2C"
    )
    pcie_switch_groups: list[list[int]] = Field(
        default_factory=list, description="local GPUs under one PCIe switch (PIX/PXB)"
    )
    numa_groups: list[list[int]] = Field(
        default_factory=list, description="local GPUs attached to one CPU socket (else SYS)"
    )

    @property
    def host_bytes_per_s(self) -> float:
        """What a GPU can copy to or from host memory per direction."""
        return self.host_bandwidth_bytes_per_s or self.pcie_bandwidth_bytes_per_s

    @model_validator(mode="after")
    def _nvlink_fields(self) -> IntraNodeFabric:
        if self.kind != "pcie" and self.nvlink_bandwidth_bytes_per_s is None:
            raise ValueError(f"kind {self.kind} needs nvlink_bandwidth_bytes_per_s (per GPU, per "
                             "direction); set it, or kind: pcie")
        if self.kind == "nvlink_bridge" and not self.nvlink_groups:
            raise ValueError("kind nvlink_bridge needs nvlink_groups (the GPUs each bridge joins, "
                             "e.g. [[0, 1], [2, 3]])")
        return self


class NIC(Spec):
    """A network adapter port used for training traffic; ``gpus`` share it (a rail each)."""

    name: str = Field(pattern=NAME_PATTERN, max_length=32, description="RDMA device, e.g. mlx5_0")
    rate_gbps: float = Field(ge=MIN_BYTES_PER_S * 8 / 1e9, le=10_000,
                             description="line rate in Gb/s (bits): NDR = 400")
    gpus: list[int] = Field(min_length=1, description="local GPU indices closest to this NIC")
    netdev: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=32)

    @property
    def rate_bytes_per_s(self) -> float:
        return self.rate_gbps * 1e9 / 8


def _gpu_or_preset_name(schema: dict[str, Any]) -> None:
    """JSON schema of ``NodeType.gpu``: a GPU object or, as cluster files have it, a preset name."""
    from placer.spec.presets import gpu_names

    by_value = dict(schema)
    schema.clear()
    schema["anyOf"] = [by_value, {"type": "string", "enum": gpu_names(),
                                  "description": "a GPU preset name (placer presets)"}]


class NodeType(Spec):
    """One kind of server: its GPUs, their fabric, and its NICs."""

    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    gpu: GPU = Field(json_schema_extra=_gpu_or_preset_name)
    gpus_per_node: int = Field(ge=1, le=1024)
    fabric: IntraNodeFabric
    nics: list[NIC] = Field(default_factory=list)

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_from_catalog(cls, value: object) -> object:
        if isinstance(value, str):
            from placer.spec.presets import load_gpu

            try:
                return load_gpu(value, "gpu")
            except InputError as exc:  # raised as pydantic's, so the error names the field
                raise ValueError(exc.fix) from None
        return value

    @model_validator(mode="after")
    def _local_indices(self) -> NodeType:
        n = self.gpus_per_node
        groups = [(f"fabric.{field}.{i}", group) for field in
                  ("nvlink_groups", "pcie_switch_groups", "numa_groups")
                  for i, group in enumerate(getattr(self.fabric, field))]
        groups += [(f"nics.{i}.gpus", nic.gpus) for i, nic in enumerate(self.nics)]
        for where, group in groups:
            bad = [g for g in group if not 0 <= g < n]
            if bad:
                raise ValueError(f"{where}: GPU index {bad[0]} is outside 0..{n - 1} "
                                 f"(gpus_per_node {n}); use a local index of that range")
        return self

    @property
    def nvlink_domain_size(self) -> int:
        """GPUs that share one NVLink domain; 1 for PCIe-only nodes."""
        if self.fabric.kind == "pcie":
            return 1
        if self.fabric.kind == "nvlink_bridge":
            return max(len(g) for g in self.fabric.nvlink_groups)
        return self.fabric.nvlink_domain_size or self.gpus_per_node

    @property
    def network_bytes_per_s(self) -> float:
        """Total NIC line rate of one node, bytes/s."""
        return sum(nic.rate_bytes_per_s for nic in self.nics)


class NetworkFabric(Spec):
    """Inter-node network: rails, fat tree, oversubscription."""

    kind: Literal["infiniband", "roce", "ethernet", "none"] = "infiniband"
    rail_optimized: bool = Field(
        default=True, description="same-index NICs of every node share a leaf switch (rails)"
    )
    nodes_per_leaf: int = Field(
        default=32, ge=1, description="nodes under one leaf group (a DGX SuperPOD SU has 32)"
    )
    oversubscription: float = Field(
        default=1.0, ge=1.0, le=64.0, description="leaf-to-spine taper: 1 = non-blocking"
    )


class LinkLatency(Spec):
    """Base latency of one hop (one ring step) per link class, seconds."""

    nvlink_s: float = Field(default=3.0e-6, gt=0, le=1.0)
    pcie_s: float = Field(default=6.0e-6, gt=0, le=1.0)
    network_s: float = Field(default=8.0e-6, gt=0, le=1.0)


class NodePool(Spec):
    """``count`` nodes of one node type, optionally with their host names."""

    node_type: str = Field(pattern=NAME_PATTERN, max_length=64)
    count: int = Field(ge=1, le=1_000_000)
    hostnames: list[str] | None = None

    @field_validator("hostnames")
    @classmethod
    def _hostnames(cls, value: list[str] | None) -> list[str] | None:
        import re

        for host in value or []:
            if not re.fullmatch(HOSTNAME_PATTERN, host):
                raise ValueError(
                    f"host name {host!r} must be letters, digits, '.' and '-' (RFC 1123)"
                )
        return value

    @model_validator(mode="after")
    def _hostname_count(self) -> NodePool:
        if self.hostnames is not None and len(self.hostnames) != self.count:
            raise ValueError(f"hostnames: {len(self.hostnames)} given for count {self.count} "
                             "nodes; give one per node")
        return self


class GpuRef(Spec):
    """A GPU by node index (over all pools, in order) and local GPU index."""

    node: int = Field(ge=0)
    gpu: int = Field(ge=0)


class NodeInfo(Spec):
    """One concrete node of the cluster, after expanding pools."""

    index: int
    node_type: NodeType
    hostname: str | None
    healthy_gpus: tuple[int, ...]


class Cluster(Spec):
    """A whole cluster; the healthy GPUs are the ones a job can use."""

    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    description: str = Field(default="", max_length=500)
    node_types: list[NodeType] = Field(min_length=1)
    pools: list[NodePool] = Field(min_length=1)
    excluded_gpus: list[GpuRef] = Field(
        default_factory=list, description="failed or reserved GPUs; placer never places ranks there"
    )
    network: NetworkFabric = Field(default_factory=NetworkFabric)
    latency: LinkLatency = Field(default_factory=LinkLatency)
    socket_ifname: str | None = Field(
        default=None, pattern=IFNAME_PATTERN, description="NCCL_SOCKET_IFNAME for bootstrap"
    )

    @model_validator(mode="after")
    def _references(self) -> Cluster:
        names = [t.name for t in self.node_types]
        twice = [name for i, name in enumerate(names) if name in names[:i]]
        if twice:
            raise ValueError(f"node_types: name {twice[0]!r} is used twice; give each node type "
                             "its own name")
        for i, pool in enumerate(self.pools):
            if pool.node_type not in names:
                raise ValueError(f"pools.{i}.node_type: {pool.node_type!r} is not a node type; "
                                 f"use one of node_types' names ({', '.join(names)})")
        total = sum(p.count for p in self.pools)
        for i, ref in enumerate(self.excluded_gpus):
            if ref.node >= total:
                raise ValueError(f"excluded_gpus.{i}.node: {ref.node} does not exist; nodes are "
                                 f"0..{total - 1}, counted over the pools in order")
            per_node = self.node_type_of(ref.node).gpus_per_node
            if ref.gpu >= per_node:
                raise ValueError(f"excluded_gpus.{i}.gpu: {ref.gpu} does not exist on node "
                                 f"{ref.node}; its GPUs are 0..{per_node - 1}")
        if self.num_gpus == 0:
            raise ValueError("excluded_gpus: every GPU of the cluster is excluded; leave one "
                             "healthy")
        return self

    def node_type_named(self, name: str) -> NodeType:
        return next(t for t in self.node_types if t.name == name)

    @cached_property
    def _pool_starts(self) -> list[int]:
        starts, total = [], 0
        for pool in self.pools:
            starts.append(total)
            total += pool.count
        return starts

    @property
    def num_nodes(self) -> int:
        return sum(p.count for p in self.pools)

    def node_type_of(self, node: int) -> NodeType:
        for pool, start in zip(reversed(self.pools), reversed(self._pool_starts), strict=True):
            if node >= start:
                return self.node_type_named(pool.node_type)
        raise IndexError(node)

    @cached_property
    def _excluded(self) -> dict[int, frozenset[int]]:
        excluded: dict[int, set[int]] = {}
        for ref in self.excluded_gpus:
            excluded.setdefault(ref.node, set()).add(ref.gpu)
        return {node: frozenset(gpus) for node, gpus in excluded.items()}

    def healthy_gpus(self, node: int) -> tuple[int, ...]:
        excluded = self._excluded.get(node, frozenset())
        return tuple(g for g in range(self.node_type_of(node).gpus_per_node) if g not in excluded)

    @cached_property
    def num_gpus(self) -> int:
        """Healthy GPUs over all nodes."""
        total = sum(self.node_type_named(p.node_type).gpus_per_node * p.count for p in self.pools)
        return total - sum(len(g) for g in self._excluded.values())

    @property
    def mixed_node_types(self) -> bool:
        """The pools use more than one node type: stages split by GPU speed, MFU of the peaks
        of the GPUs used."""
        return len({p.node_type for p in self.pools}) > 1

    @property
    def is_regular(self) -> bool:
        """One node type and no excluded GPU: placement can use symmetry."""
        return not self.mixed_node_types and not self.excluded_gpus

    def nodes(self) -> list[NodeInfo]:
        """Every node with its type, host name and healthy GPUs (expands the pools)."""
        out: list[NodeInfo] = []
        for pool, start in zip(self.pools, self._pool_starts, strict=True):
            node_type = self.node_type_named(pool.node_type)
            for i in range(pool.count):
                host = pool.hostnames[i] if pool.hostnames else None
                node = start + i
                out.append(NodeInfo(index=node, node_type=node_type, hostname=host,
                                    healthy_gpus=self.healthy_gpus(node)))
        return out

    def with_nodes(self, count: int) -> Cluster:
        """The same cluster with ``count`` nodes (single-pool clusters only)."""
        from placer.errors import InputError

        if count < 1:
            raise InputError("--nodes", count, "must be a positive integer")
        if len(self.pools) != 1:
            raise InputError(
                "--nodes", count, f"cluster {self.name!r} has several node pools; edit its file"
            )
        pool = self.pools[0].model_copy(update={"count": count, "hostnames": None})
        kept = [ref for ref in self.excluded_gpus if ref.node < count]
        return Cluster.model_validate(
            {**self.model_dump(), "pools": [pool.model_dump()],
             "excluded_gpus": [r.model_dump() for r in kept]}
        )
