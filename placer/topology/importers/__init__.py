"""Read a server's topology from ``nvidia-smi topo -m`` text or an NCCL topology XML dump and
describe it as a placer ``NodeType`` (``placer topology import``).

Each format has its parser (``nvidia_smi.py``, ``nccl_xml.py``) producing a ``HostTopology``;
``infer.py`` turns that into a node type and notes what it assumed; ``output.py`` writes YAML.
"""

from __future__ import annotations

from pathlib import Path

from placer.errors import PlacerError
from placer.topology.importers.host import HostNic, HostTopology
from placer.topology.importers.infer import DEFAULT_NIC_RATE_GBPS, ImportedNode, node_type_from_host
from placer.topology.importers.nccl_xml import looks_like_xml, parse_nccl_xml
from placer.topology.importers.nvidia_smi import parse_topo_matrix
from placer.topology.importers.output import cluster_document, node_type_document, render_yaml

MAX_TOPOLOGY_BYTES = 16 * 1024 * 1024

__all__ = [
    "DEFAULT_NIC_RATE_GBPS", "HostNic", "HostTopology", "ImportedNode", "cluster_document",
    "import_topology", "node_type_document", "parse_topology", "read_topology_file",
    "render_yaml",
]


def read_topology_file(path: Path) -> str:
    """The file's text; a missing, huge or binary file is a one-line PlacerError."""
    if not path.is_file():
        raise PlacerError(f"{path}: no such file")
    if path.stat().st_size > MAX_TOPOLOGY_BYTES:
        raise PlacerError(f"{path}: file is larger than {MAX_TOPOLOGY_BYTES // 2**20} MiB; "
                          "a topology file is a few KiB")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlacerError(f"{path}: cannot read as UTF-8 text ({exc.__class__.__name__})") from None


def parse_topology(text: str, source: str) -> HostTopology:
    """Either format, told apart by its first character (XML starts with '<')."""
    if looks_like_xml(text):
        return parse_nccl_xml(text, source)
    return parse_topo_matrix(text, source)


def import_topology(text: str, source: str, name: str, gpu: str | None = None,
                    nic_rate_gbps: float | None = None) -> ImportedNode:
    """The node type a topology file describes (``gpu``: a GPU preset name)."""
    host = parse_topology(text, source)
    return node_type_from_host(host, name=name, source=source, gpu_name=gpu,
                               nic_rate_gbps=nic_rate_gbps)
