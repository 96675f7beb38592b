"""``placer topology import``: a server's topology file -> a placer node type or cluster file."""

from __future__ import annotations

import re
from pathlib import Path

import click

from placer.errors import InputError
from placer.io import write_text
from placer.spec.cluster import NAME_PATTERN

_NOT_NAME_CHARS = re.compile(r"[^A-Za-z0-9._+-]+")


@click.group("topology")
def topology_group() -> None:
    """Server topology: import it from nvidia-smi or NCCL."""


@topology_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="node type (and cluster) name; default: the file name")
@click.option("--gpu", metavar="GPU",
              help="GPU preset (any case); required for topo -m, which does not name the GPU "
              "(NCCL XML gives its sm: 80 -> A100-80GB, 90 -> H100-SXM-80GB, 100 -> B200)")
@click.option("--nic-rate-gbps", type=click.FloatRange(min=0, min_open=True, max=10_000),
              help="NIC line rate in Gb/s; topo -m has none (default 400), NCCL XML has speed")
@click.option("--cluster", "as_cluster", is_flag=True,
              help="write a whole cluster file (one pool of --nodes such nodes) that --cluster "
              "options accept, instead of a node type")
@click.option("--nodes", type=click.IntRange(min=1, max=1_000_000),
              help="nodes in the pool with --cluster (default 1; scale later with --nodes)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="write the YAML here (whole, never half-written); default: stdout")
@click.option("--force", is_flag=True, help="replace the --out file if it exists")
def import_command(file: Path, name: str | None, gpu: str | None, nic_rate_gbps: float | None,
                   as_cluster: bool, nodes: int | None, out: Path | None, force: bool) -> None:
    """Describe a server from `nvidia-smi topo -m` output or an NCCL topology dump.

    FILE is the text `nvidia-smi topo -m` prints, or the XML NCCL writes with
    NCCL_TOPO_DUMP_FILE=topo.xml. The result is a node type (to paste under node_types: of a
    cluster file) or, with --cluster, a ready cluster file.

    \b
    Inferred: the intra-node fabric (every GPU pair NV# -> nvswitch; NVLink only in
    pairs/groups -> nvlink_bridge with nvlink_groups; none -> pcie), NVLink generation and
    bandwidth per GPU from the link count and the GPU, PCIe switch groups (PIX/PXB), NUMA
    groups (NODE/SYS, NUMA affinity), and the NICs under each GPU's PCIe switch (names from
    the NIC Legend or the XML). Assumed, and written as comments: GPU memory (no topology file
    gives it), the NIC rate for topo -m, the PCIe speed for topo -m, the cluster network.
    """
    from placer.topology.importers import (
        cluster_document,
        import_topology,
        node_type_document,
        read_topology_file,
        render_yaml,
    )

    if nodes is not None and not as_cluster:
        raise click.UsageError("--nodes needs --cluster")
    node_name = _node_name(name, file)
    text = read_topology_file(file)
    imported = import_topology(text, source=str(file), name=node_name, gpu=gpu,
                               nic_rate_gbps=nic_rate_gbps)
    origin = f"{file.name} ({imported.source_format})"
    notes = list(imported.notes)
    if as_cluster:
        document = cluster_document(imported, nodes or 1, f"imported from {origin}")
        assumed = " (assumed: the file does not say IB or Ethernet)"
        notes.append(f"network: {imported.network_kind}"
                     f"{assumed if imported.network_kind_assumed else ''}, with placer's defaults "
                     "(rail-optimized, non-blocking, 32 nodes per leaf); edit network: to match")
        kind = "cluster"
    else:
        document = node_type_document(imported)
        kind = "node type"
    yaml_text = render_yaml(document, [f"placer {kind} imported from {origin}", *notes])
    if out is None:
        click.echo(yaml_text, nl=False)
        return
    write_text(out, yaml_text, "--out", force)
    node_type = imported.node_type
    click.echo(f"wrote {kind} {node_name!r} to {out}: {node_type.gpus_per_node}x "
               f"{node_type.gpu.name}, {node_type.fabric.kind}, {len(node_type.nics)} NICs")
    for note in notes:
        click.echo(f"note: {note}", err=True)


def _node_name(name: str | None, file: Path) -> str:
    if name is not None:
        if not re.fullmatch(NAME_PATTERN, name) or len(name) > 64:
            raise InputError("--name", name, "use letters, digits, '.', '_', '+' and '-' "
                             "(at most 64), starting with a letter or digit")
        return name
    stem = _NOT_NAME_CHARS.sub("-", file.stem).strip("-._+")[:64]
    return stem or "imported-node"


COMMANDS = [topology_group]
