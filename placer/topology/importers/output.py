"""YAML for an imported node type: alone (to paste into a cluster file) or as a whole cluster."""

from __future__ import annotations

from typing import Any

import yaml

from placer.spec.cluster import Cluster
from placer.spec.presets import validated
from placer.topology.importers.infer import ImportedNode


def node_type_document(imported: ImportedNode) -> dict[str, Any]:
    """The node type as cluster files write it: the GPU by preset name, unset fields left out."""
    document = imported.node_type.model_dump(mode="json", exclude_none=True)
    document["gpu"] = imported.node_type.gpu.name
    return document


def cluster_document(imported: ImportedNode, nodes: int, description: str) -> dict[str, Any]:
    """A one-pool cluster of ``nodes`` such nodes, validated as placer will load it."""
    node_type = node_type_document(imported)
    document = {
        "name": node_type["name"],
        "description": description[:500],
        "node_types": [node_type],
        "pools": [{"node_type": node_type["name"], "count": nodes}],
        "network": {"kind": imported.network_kind},
    }
    validated(Cluster, document, "imported cluster")
    return document


def render_yaml(document: dict[str, Any], comments: list[str]) -> str:
    """Block-style YAML (short lists inline) under ``#`` comment lines; deterministic."""
    header = "".join(f"# {line}\n" for line in comments)
    body = yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=100)
    return header + body
