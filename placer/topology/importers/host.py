"""What one server's topology file says, in a form shared by both importers.

``nvidia-smi topo -m`` and NCCL's topology XML describe the same things differently; each importer
turns its file into a ``HostTopology`` and ``infer.py`` turns that into a placer ``NodeType``.
GPU indices are local (0..n-1); PCIe relations use nvidia-smi's names, best first.
"""

from __future__ import annotations

from dataclasses import dataclass

# Best first (docs/sources.md 8.1): one PCIe bridge, several bridges, a host bridge, host bridges
# inside one NUMA node, across NUMA nodes.
PCIE_RELATIONS = ("PIX", "PXB", "PHB", "NODE", "SYS")
SAME_SWITCH = frozenset({"PIX", "PXB"})
SAME_NUMA = frozenset({"PIX", "PXB", "PHB", "NODE"})


@dataclass(frozen=True)
class HostNic:
    """One NIC port and how far it is from each GPU."""

    name: str
    relation: tuple[str | None, ...]
    """PCIe relation to each GPU (PIX..SYS); None where the file does not say."""
    rate_gbps: float | None = None
    """Line rate in Gb/s when the file gives it (NCCL XML ``speed``); topo -m has none."""
    transport: str | None = None
    """"infiniband" or "ethernet" from the PCI class (NCCL XML), else None."""


@dataclass(frozen=True)
class HostTopology:
    """GPUs, NVLinks, PCIe tree, NUMA nodes and NICs of one server, as read from a file."""

    source_format: str
    num_gpus: int
    nvlinks: tuple[tuple[int, ...], ...]
    """NVLink count between GPU pairs as the file shows it (nvidia-smi's NV#, or direct links)."""
    pcie: tuple[tuple[str | None, ...], ...]
    """PCIe relation between GPU pairs; None on the diagonal and where NVLink hides it."""
    numa: tuple[int | None, ...]
    """NUMA node of each GPU when the file says."""
    nics: tuple[HostNic, ...] = ()
    nvswitch_links: tuple[int, ...] | None = None
    """Links from each GPU to NVSwitches when the file tells switches apart (NCCL XML)."""
    multi_node_nvlink: bool = False
    sm: int | None = None
    grace: bool = False
    """A C2C link to a Grace CPU (GB200/GH200)."""
    pcie_bytes_per_s: float | None = None
    """Slowest GPU PCIe link per direction when the file gives link speeds (NCCL XML)."""
    notes: tuple[str, ...] = ()
