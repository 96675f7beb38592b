"""Parse ``nvidia-smi topo -m`` output (docs/sources.md 8.1-8.2) into a ``HostTopology``.

The matrix starts at the header line whose first cell is ``GPU0``; its columns are the GPUs, then
the NICs (``NIC0``.. in newer drivers, ``mlx5_0``.. in older ones), then affinity columns (``CPU
Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``). Cells are separated by tabs or spaces; the header
may carry ANSI underline escapes. The matrix ends at the first line that is not a device row; what
follows (the legend) is ignored except the ``NIC Legend`` that names NICs (``NIC0: mlx5_0``).
"""

from __future__ import annotations

import re

from placer.errors import PlacerError, short_repr
from placer.spec.text import decimal
from placer.topology.importers.host import PCIE_RELATIONS, HostNic, HostTopology

FORMAT = "nvidia-smi topo -m"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
NVLINK_CELL = re.compile(r"^NV([1-9][0-9]*)$")
GPU_LABEL = re.compile(r"^GPU([0-9]+)$")
DEVICE_LABEL = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]*$")
# Drivers before the NODE level printed SOC ("the SMP link between CPU sockets") for today's SYS.
CELL_ALIASES = {"SOC": "SYS"}
AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
LEGEND_ENTRY = re.compile(r"^\s*(NIC[0-9]+)\s*:\s*([A-Za-z0-9][A-Za-z0-9._+-]*)\s*$")
# The compact form used in docs/sources.md 8.2 (a): "NIC0..NIC9 = mlx5_0..mlx5_9".
LEGEND_RANGE = re.compile(
    r"NIC([0-9]+)\.\.NIC([0-9]+)\s*=\s*([A-Za-z][A-Za-z0-9_]*?)([0-9]+)\.\.\3([0-9]+)"
)
CELL_FORMS = "X, NV#, PIX, PXB, PHB, NODE or SYS"


def _cells(line: str) -> list[str]:
    return ANSI_ESCAPE.sub("", line).split()


def parse_topo_matrix(text: str, source: str) -> HostTopology:
    """The topology in ``nvidia-smi topo -m`` text; malformed input is a one-line PlacerError."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _cells(line)[:1] == ["GPU0"]), None)
    if start is None:
        raise PlacerError(
            f"{source}: not an `nvidia-smi topo -m` matrix (no header line starting with GPU0) "
            "and not NCCL topology XML"
        )
    labels, num_gpus, affinity = _header(_cells(lines[start]), source, start + 1)
    rows: dict[str, tuple[list[str], list[str]]] = {}
    end = start + 1
    for end in range(start + 1, len(lines) + 1):
        cells = _cells(lines[end]) if end < len(lines) else []
        if not cells or cells[0] not in labels:
            break
        if cells[0] in rows:
            raise PlacerError(f"{source}:{end + 1}: row {cells[0]} appears twice")
        rows[cells[0]] = _row(cells, labels, len(affinity), source, end + 1)
    for label in labels[:num_gpus]:
        if label not in rows:
            raise PlacerError(f"{source}: the matrix has no row for {label}")
    gpu_rows = [rows[label] for label in labels[:num_gpus]]
    _check_cells(gpu_rows, labels, source)
    nvlinks = tuple(tuple(_nvlink_count(row[0][j]) for j in range(num_gpus)) for row in gpu_rows)
    pcie = tuple(tuple(_pcie(row[0][j]) for j in range(num_gpus)) for row in gpu_rows)
    names = _nic_legend(lines[end:])
    nics = tuple(
        HostNic(name=names.get(label, label),
                relation=tuple(row[0][j] for row in gpu_rows))
        for j, label in enumerate(labels) if j >= num_gpus
    )
    numa_column = affinity.index("NUMA Affinity") if "NUMA Affinity" in affinity else None
    numa = tuple(_numa(row[1], numa_column) for row in gpu_rows)
    return HostTopology(source_format=FORMAT, num_gpus=num_gpus, nvlinks=nvlinks, pcie=pcie,
                        numa=numa, nics=nics)


def _header(cells: list[str], source: str, line: int) -> tuple[list[str], int, list[str]]:
    """Device column labels, how many of them are GPUs, and the affinity column names."""
    split = next((i for i, c in enumerate(cells) if c in ("CPU", "NUMA", "GPU")), len(cells))
    labels, rest = cells[:split], " ".join(cells[split:])
    num_gpus = 0
    while num_gpus < len(labels) and labels[num_gpus] == f"GPU{num_gpus}":
        num_gpus += 1
    if any(_is_cell(label) for label in labels):
        raise PlacerError(f"{source}:{line}: the matrix has no header row (GPU0 GPU1 ...); this "
                          "line holds cells")
    for label in labels[num_gpus:]:
        if GPU_LABEL.match(label) or not DEVICE_LABEL.match(label) or labels.count(label) > 1:
            raise PlacerError(
                f"{source}:{line}: header column {short_repr(label)} is not valid; the header "
                "names GPU0, GPU1, ... in order, then each NIC once"
            )
    affinity: list[str] = []
    while rest:
        column = next((c for c in AFFINITY_COLUMNS if rest.startswith(c)), None)
        if column is None:
            raise PlacerError(
                f"{source}:{line}: unknown header column {short_repr(rest.split()[0])}; expected "
                f"device labels then {', '.join(AFFINITY_COLUMNS)}"
            )
        affinity.append(column)
        rest = rest[len(column):].strip()
    return labels, num_gpus, affinity


def _row(cells: list[str], labels: list[str], num_affinity: int, source: str,
         line: int) -> tuple[list[str], list[str]]:
    """The device cells (normalised) and the affinity cells of one row."""
    label, values = cells[0], cells[1:]
    n = len(labels)
    where = f"{source}:{line}: row {label}"
    if len(values) < n:
        raise PlacerError(f"{where} has {len(values)} cells but the header names {n} devices")
    if len(values) > n + num_affinity:
        raise PlacerError(
            f"{where} has {len(values)} cells, more than the header's {n} devices and "
            f"{num_affinity} affinity columns"
        )
    device = []
    for column, raw in zip(labels, values[:n], strict=True):
        value = CELL_ALIASES.get(raw, raw)
        if not _is_cell(value):
            if len(values) not in (n, n + num_affinity):
                raise PlacerError(f"{where} has {len(values)} cells; the header has {n} devices "
                                  f"and {num_affinity} affinity columns")
            raise PlacerError(
                f"{where}, column {column}: unknown cell {short_repr(raw)}; expected {CELL_FORMS}"
            )
        device.append(value)
    return device, values[n:]


def _check_cells(gpu_rows: list[tuple[list[str], list[str]]], labels: list[str],
                 source: str) -> None:
    num_gpus = len(gpu_rows)
    for i, (cells, _) in enumerate(gpu_rows):
        for j, value in enumerate(cells):
            where = f"{source}: row GPU{i}, column {labels[j]}"
            if (value == "X") != (i == j):
                raise PlacerError(f"{where}: {value} is not valid; X marks the diagonal only")
            if j >= num_gpus and NVLINK_CELL.match(value):
                raise PlacerError(f"{where}: {value} is not valid; a NIC has no NVLink")
            if j < num_gpus and gpu_rows[j][0][i] != value:
                raise PlacerError(
                    f"{where}: {value} but row GPU{j} says {gpu_rows[j][0][i]}; the GPU part of "
                    "the matrix must be symmetric"
                )


def _is_cell(value: str) -> bool:
    return value == "X" or value in PCIE_RELATIONS or bool(NVLINK_CELL.match(value))


def _nvlink_count(cell: str) -> int:
    match = NVLINK_CELL.match(cell)
    return int(match.group(1)) if match else 0


def _pcie(cell: str) -> str | None:
    return cell if cell in PCIE_RELATIONS else None


def _numa(affinity_cells: list[str], column: int | None) -> int | None:
    if column is None or column >= len(affinity_cells):
        return None
    return decimal(affinity_cells[column])


def _nic_legend(lines: list[str]) -> dict[str, str]:
    """NIC label -> device name from the legend after the matrix."""
    names: dict[str, str] = {}
    for line in lines:
        entry = LEGEND_ENTRY.match(ANSI_ESCAPE.sub("", line))
        if entry:
            names[entry.group(1)] = entry.group(2)
            continue
        span = LEGEND_RANGE.search(line)
        if span:
            first, last, prefix, start = (int(span.group(1)), int(span.group(2)), span.group(3),
                                          int(span.group(4)))
            if last - first == int(span.group(5)) - start:
                for k in range(last - first + 1):
                    names[f"NIC{first + k}"] = f"{prefix}{start + k}"
    return names
