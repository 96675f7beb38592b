"""Parse an NCCL topology dump (``NCCL_TOPO_DUMP_FILE``, docs/sources.md 8.3) into a
``HostTopology``.

``<cpu numaid>`` elements hold a tree of ``<pci>`` bridges and devices; a GPU is a ``<pci>`` with
a ``<gpu dev sm>`` child listing ``<nvlink target count tclass>``; a NIC is a ``<pci>`` with a
``<nic>`` of one ``<net name speed>`` per port (speed in Mb/s). PCIe relations come from the tree:
two devices under the same bridge are PIX, under one switch tree PXB, under one CPU PHB, else SYS
(NCCL has no NODE level).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from placer.errors import PlacerError, short_repr
from placer.spec.text import decimal
from placer.topology.importers.gpu_links import PCIE_X16_BYTES_PER_S_BY_GTS
from placer.topology.importers.host import HostNic, HostTopology

FORMAT = "NCCL topology XML"
NVSWITCH_CLASS = "0x068000"  # tclass of an NVLink to an NVSwitch (docs/sources.md 8.3)
MULTI_NODE_TARGET = "fffffff:ff:ff.0"  # NVLink through the rack's switch trays (GB200/GB300)
INFINIBAND_CLASS_PREFIX = "0x0207"
GPU_CLASS_PREFIX = "0x03"


def looks_like_xml(text: str) -> bool:
    return text.lstrip().startswith("<")


class _Tree:
    """The parsed document with parent links (ElementTree has none)."""

    def __init__(self, root: ET.Element) -> None:
        self.root = root
        self.parent = {child: parent for parent in root.iter() for child in parent}

    def chain(self, element: ET.Element) -> list[ET.Element]:
        """``element`` and its ancestors up to the root."""
        out = [element]
        while out[-1] in self.parent:
            out.append(self.parent[out[-1]])
        return out

    def cpu_of(self, element: ET.Element) -> ET.Element | None:
        return next((e for e in self.chain(element) if e.tag == "cpu"), None)

    def relation(self, a: ET.Element, b: ET.Element) -> str:
        """nvidia-smi's name for the PCIe path between two device ``<pci>`` elements."""
        cpu_a, cpu_b = self.cpu_of(a), self.cpu_of(b)
        if cpu_a is None or cpu_a is not cpu_b:
            return "SYS"
        above_a = {id(e) for e in self.chain(a)[1:]}
        common = next(e for e in self.chain(b)[1:] if id(e) in above_a)
        if common.tag == "cpu":
            return "PHB"
        return "PIX" if self.parent.get(a) is common and self.parent.get(b) is common else "PXB"


def parse_nccl_xml(text: str, source: str) -> HostTopology:
    """The topology in an NCCL XML dump; malformed or partial files are a one-line PlacerError."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line = exc.position[0] if exc.position else 0
        reason = str(exc).split(":")[0]
        raise PlacerError(f"{source}:{line}: invalid XML: {reason}") from None
    if root.tag != "system":
        raise PlacerError(
            f"{source}: the XML root is <{root.tag}>, not <system> (an NCCL_TOPO_DUMP_FILE dump)"
        )
    tree = _Tree(root)
    gpus = _gpus(tree, source)
    busids = {_busid(pci.get("busid", "")): index for index, (pci, _) in enumerate(gpus)}
    n = len(gpus)
    nvlinks = [[0] * n for _ in range(n)]
    switch_links = [0] * n
    notes: list[str] = []
    multi_node = False
    for i, (_, gpu) in enumerate(gpus):
        for link in gpu.iter("nvlink"):
            count = _int_attr(link, "count", source)
            target = _busid(link.get("target", ""))
            if link.get("tclass", "").lower() == NVSWITCH_CLASS:
                switch_links[i] += count
                multi_node = multi_node or target == MULTI_NODE_TARGET
            elif target in busids and busids[target] != i:
                nvlinks[i][busids[target]] += count
            else:
                notes.append(f"GPU{i}: NVLink to {short_repr(link.get('target'))} (not a GPU of "
                             "this file or an NVSwitch) ignored")
    pcie = tuple(
        tuple(None if i == j else tree.relation(gpus[i][0], gpus[j][0]) for j in range(n))
        for i in range(n)
    )
    has_switch_links = any(switch_links)
    return HostTopology(
        source_format=FORMAT,
        num_gpus=n,
        nvlinks=tuple(tuple(row) for row in nvlinks),
        pcie=pcie,
        numa=tuple(_numa(tree, pci) for pci, _ in gpus),
        nics=_nics(tree, [pci for pci, _ in gpus], source),
        nvswitch_links=tuple(switch_links) if has_switch_links else None,
        multi_node_nvlink=multi_node,
        sm=_sm(gpus, source),
        grace=any(True for _ in root.iter("c2c")),
        pcie_bytes_per_s=_pcie_bytes_per_s([pci for pci, _ in gpus], notes),
        notes=tuple(notes),
    )


def _gpus(tree: _Tree, source: str) -> list[tuple[ET.Element, ET.Element]]:
    """(device <pci>, <gpu>) pairs in NVML index order."""
    for pci in tree.root.iter("pci"):
        if pci.get("class", "").startswith(GPU_CLASS_PREFIX) and pci.find("gpu") is None:
            raise PlacerError(
                f"{source}: GPU {short_repr(pci.get('busid'))} has no <gpu> element: this is a "
                "partial NCCL_TOPO_FILE; dump the detected topology with "
                "NCCL_TOPO_DUMP_FILE=topo.xml instead"
            )
    found = []
    for gpu in tree.root.iter("gpu"):
        pci = tree.parent.get(gpu)
        if pci is None or pci.tag != "pci" or not pci.get("busid"):
            raise PlacerError(f"{source}: a <gpu> element is not inside a <pci busid=...> element")
        found.append((pci, gpu))
    if not found:
        raise PlacerError(f"{source}: the NCCL topology has no <gpu> element")
    if all(gpu.get("dev") is not None for _, gpu in found):
        found.sort(key=lambda pair: _int_attr(pair[1], "dev", source))
        devs = [_int_attr(gpu, "dev", source) for _, gpu in found]
        if len(set(devs)) != len(devs):
            raise PlacerError(f"{source}: two <gpu> elements have the same dev {devs}")
    return found


def _nics(tree: _Tree, gpu_pcis: list[ET.Element], source: str) -> tuple[HostNic, ...]:
    nics = []
    for net in tree.root.iter("net"):
        nic = tree.parent.get(net)
        where = nic if nic is not None and nic.tag == "nic" else net
        device = tree.parent.get(where)
        if device is None or device.tag != "pci":
            continue  # a socket interface (no PCIe position), not an RDMA NIC
        name = net.get("name")
        if not name:
            raise PlacerError(f"{source}: a <net> element has no name")
        speed = net.get("speed")
        rate = _int_attr(net, "speed", source) / 1000 if speed else None  # Mb/s -> Gb/s
        transport = ("infiniband" if device.get("class", "").startswith(INFINIBAND_CLASS_PREFIX)
                     else "ethernet")
        nics.append(HostNic(name=name, rate_gbps=rate or None, transport=transport,
                            relation=tuple(tree.relation(gpu, device) for gpu in gpu_pcis)))
    return tuple(nics)


def _numa(tree: _Tree, element: ET.Element) -> int | None:
    cpu = tree.cpu_of(element)
    value = cpu.get("numaid", "") if cpu is not None else ""
    return decimal(value)


def _sm(gpus: list[tuple[ET.Element, ET.Element]], source: str) -> int | None:
    values = sorted({gpu.get("sm", "") for _, gpu in gpus} - {""})
    if len(values) > 1:
        raise PlacerError(f"{source}: GPUs of different kinds (sm {', '.join(values)}) in one node")
    if not values:
        return None
    sm = decimal(values[0])
    if sm is None:
        raise PlacerError(f"{source}: <gpu sm={short_repr(values[0])}> is not a number")
    return sm


def _pcie_bytes_per_s(gpu_pcis: list[ET.Element], notes: list[str]) -> float | None:
    """Slowest GPU link, from link_speed ("32.0 GT/s PCIe") and link_width (0 in VMs: x16)."""
    rates = []
    for pci in gpu_pcis:
        speed = pci.get("link_speed", "").split(" ")[0]
        try:
            per_x16 = PCIE_X16_BYTES_PER_S_BY_GTS[float(speed)]
        except (ValueError, KeyError):
            return None
        width = pci.get("link_width", "")
        lanes = decimal(width) or 16
        rates.append(per_x16 * min(lanes, 16) / 16)
    if any(pci.get("link_width", "0") in ("", "0") for pci in gpu_pcis):
        notes.append("GPU PCIe link width not reported (0, as in VMs): x16 assumed")
    return min(rates) if rates else None


def _busid(text: str) -> str:
    """Bus id, lower case, without the domain's leading zeros ("0000:A4:00.0" -> "0:a4:00.0")."""
    domain, sep, rest = text.strip().lower().partition(":")
    if not sep:
        return text.strip().lower()
    return f"{domain.lstrip('0') or '0'}:{rest}"


def _int_attr(element: ET.Element, name: str, source: str) -> int:
    value = element.get(name, "")
    number = decimal(value)
    if number is None:
        raise PlacerError(
            f"{source}: <{element.tag} {name}={short_repr(value)}> is not a non-negative integer"
        )
    return number
