"""Link classes and the result records of topology queries."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from placer.spec.cluster import LinkLatency

# Slowest last. "local" is a group of one GPU (no hop at all).
LINK_CLASS_ORDER = ("local", "nvlink", "pcie", "network")
_RANK = {name: rank for rank, name in enumerate(LINK_CLASS_ORDER)}


def slower_class(a: str, b: str) -> str:
    """The slower of two link classes."""
    return a if _RANK[a] >= _RANK[b] else b


def class_latency_s(latency: LinkLatency, link_class: str) -> float:
    """Base latency of one ring step over a link class (cluster.latency); 0 for "local"."""
    if link_class == "local":
        return 0.0
    return float(getattr(latency, f"{link_class}_s"))


@dataclass(frozen=True)
class GroupLink:
    """What one communicator (TP, DP, PP... group) can get from the hardware.

    Bandwidths are per direction in bytes/s. See ``placer.topology`` for the rules.
    """

    size: int
    num_nodes: int
    max_gpus_per_node: int
    within_nvlink_domain: bool
    link_class: str
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    node_inter_bytes_per_s: float
    intra_latency_s: float
    inter_latency_s: float
    nvls: bool
    crosses_leaf: bool
    rail_aligned: bool


@dataclass(frozen=True)
class PathHop:
    """One edge of a route through the cluster graph (for explanations)."""

    src: Hashable
    dst: Hashable
    link_class: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
