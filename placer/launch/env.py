"""``env.sh``: the NCCL and torch environment that follows from the cluster and the plan.

Only NCCL's "system configuration" variables and torch's process-group settings are emitted by
default; NCCL's "debugging" variables (ALGO, PROTO, NVLS_ENABLE, ...) carry the warning "should not
be used in production nor retained in scripts" and appear only with ``--debug``
(docs/sources.md 3 and 10.4). Every line says why it is there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from placer.launch.rankmap import PlacedCandidate
from placer.launch.shell import checked, comment_block, quote, single_quoted
from placer.spec import GPU, Layout, NodeType
from placer.spec.runtime import LAUNCH_ALLOC_CONF

# NCCL's algorithm names for the algorithms placer's cost model reports (docs/sources.md 3,
# NCCL_ALGO); "hierarchical" has no single NCCL name and is left to NCCL.
_NCCL_ALGO_NAMES = {"ring": "Ring", "tree": "Tree", "nvls": "NVLS", "nvlstree": "NVLSTree",
                    "pat": "PAT", "collnetdirect": "CollnetDirect",
                    "collnetchain": "CollnetChain"}
# Blackwell parts (B100/B200/B300, GB200/GB300): Megatron drops its CUDA_DEVICE_MAX_CONNECTIONS=1
# requirement from this architecture on (docs/sources.md 3).
_BLACKWELL = re.compile(r"^(G?B[1-9]\d{2}(\b|[-_])|.*blackwell)", re.IGNORECASE)


@dataclass(frozen=True)
class EnvVar:
    """One exported variable and the reason it is set (written as a comment above it)."""

    name: str
    value: str
    why: str


@dataclass(frozen=True)
class EnvNote:
    """A comment-only line: a variable deliberately not set, or a hint for the user."""

    text: str


EnvLine = EnvVar | EnvNote


def is_blackwell_or_newer(gpu: GPU) -> bool:
    return bool(_BLACKWELL.match(gpu.name))


def _max_connections(layout: Layout, node_type: NodeType) -> EnvLine | None:
    """Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP>1 or CP>1 before Blackwell; FSDP
    paths assert it is not 1 (docs/sources.md 3 and 6.3)."""
    if layout.tp == 1 and layout.cp == 1:
        return None
    if layout.zero_stage >= 2:
        return EnvNote(f"CUDA_DEVICE_MAX_CONNECTIONS is not set: with zero={layout.zero_stage} "
                       "(Megatron-FSDP, FSDP) Megatron's FSDP paths assert it is not 1")
    if is_blackwell_or_newer(node_type.gpu):
        return EnvNote(f"CUDA_DEVICE_MAX_CONNECTIONS is not set: on {node_type.gpu.name} "
                       "(Blackwell) TP/CP overlap no longer needs one hardware queue")
    dims = " and ".join(f"{d}={getattr(layout, d)}" for d in ("tp", "cp") if getattr(layout, d) > 1)
    return EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "1",
                  f"{dims} on {node_type.gpu.name}: one hardware queue keeps the TP/CP "
                  "communication kernels ahead of the GEMMs they overlap (Megatron asserts it)")


def _network(placement: PlacedCandidate, node_type: NodeType) -> list[EnvLine]:
    """NIC selection for inter-node traffic; nothing when the job fits on one node."""
    cluster = placement.plan.cluster
    if len(placement.nodes) == 1:
        return [EnvNote("NCCL_IB_HCA and NCCL_CROSS_NIC are not set: the job runs on one node")]
    kind = cluster.network.kind
    if kind not in ("infiniband", "roce") or not node_type.nics:
        return [EnvNote(f"NCCL_IB_HCA is not set: {node_type.name} has no RDMA NICs in the "
                        f"cluster file (network kind {kind}); NCCL uses sockets")]
    names = [checked(nic.name, "name", f"node_types[{node_type.name}].nics.name")
             for nic in node_type.nics]
    rails = ", ".join(f"{nic.name}->GPU{'/'.join(map(str, nic.gpus))}" for nic in node_type.nics)
    lines: list[EnvLine] = [EnvVar(
        "NCCL_IB_HCA", "=" + ",".join(names),
        f"exactly the compute NICs of {node_type.name} ({rails}); '=' stops mlx5_1 from also "
        "matching mlx5_10..19 and keeps storage NICs out")]
    if cluster.network.rail_optimized:
        lines.append(EnvVar(
            "NCCL_CROSS_NIC", "0",
            "rail-optimized fabric: same-index NICs share a leaf switch, so rings and trees "
            "that keep one NIC index stay one hop away instead of crossing the spine"))
    if kind == "roce":
        lines.append(EnvNote("RoCE: also export NCCL_IB_GID_INDEX=<RoCE v2 GID index of these "
                             "NICs, see show_gids>; the cluster file does not record it"))
    return lines


def _allocator(placement: PlacedCandidate) -> EnvLine:
    """Expandable segments, which the plan's memory estimate assumed unless the job said its
    launcher runs without them (Runtime.expandable_segments; docs/recommendations.md)."""
    if placement.plan.job.runtime.expandable_segments is False:
        return EnvNote("PYTORCH_CUDA_ALLOC_CONF is not set: the job says its allocator runs "
                       "without expandable segments (runtime.expandable_segments: false), and "
                       "the plan's memory estimate kept the fragmentation allowance for it")
    return EnvVar("PYTORCH_CUDA_ALLOC_CONF", LAUNCH_ALLOC_CONF,
                  "the caching allocator grows one segment per stream by mapping pages instead "
                  "of caching fixed-size blocks, so freed activations leave no unusable gaps: "
                  "the plan's memory estimate keeps no fragmentation allowance because of this")


def common_env(placement: PlacedCandidate) -> list[EnvLine]:
    """Variables that do not depend on the node type."""
    lines: list[EnvLine] = [
        EnvVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID",
               "CUDA_VISIBLE_DEVICES in launch.sh lists nvidia-smi (PCI bus) GPU numbers; the "
               "CUDA default order is FASTEST_FIRST"),
        EnvVar("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1",
               "a failed or timed-out collective aborts the communicator and ends the process, "
               "so a broken rank fails the job instead of hanging it (torchrun's default too)"),
    ]
    lines.append(_allocator(placement))
    ifname = placement.plan.cluster.socket_ifname
    if ifname is not None:
        lines.append(EnvVar("NCCL_SOCKET_IFNAME", checked(ifname, "ifname", "socket_ifname"),
                            "bootstrap and socket traffic on the interface the cluster file "
                            "names, not a docker or link-local one"))
    else:
        lines.append(EnvNote("NCCL_SOCKET_IFNAME is not set: the cluster file has no "
                             "socket_ifname; if NCCL picks the wrong interface, export it here "
                             "(e.g. =eth0 or ^docker,lo)"))
    return lines


def node_type_env(placement: PlacedCandidate, node_type: NodeType) -> list[EnvLine]:
    """Variables whose value depends on the node type (NICs, GPU architecture)."""
    lines = _network(placement, node_type)
    max_conn = _max_connections(placement.layout, node_type)
    if max_conn is not None:
        lines.append(max_conn)
    return lines


def debug_env(placement: PlacedCandidate) -> list[EnvLine]:
    """NCCL/torch debugging output, plus the tuning overrides placer deliberately leaves off."""
    algos = sorted({_NCCL_ALGO_NAMES[c.algorithm.lower()]
                    for c in placement.candidate.collectives
                    if c.algorithm.lower() in _NCCL_ALGO_NAMES})
    lines: list[EnvLine] = [
        EnvVar("NCCL_DEBUG", "INFO", "debug: NCCL prints its version, topology and choices"),
        EnvVar("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,ENV",
               "debug: which NICs, rings/trees and environment NCCL actually used"),
        EnvVar("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",
               "debug: keep the last collectives per rank (torch's flight recorder)"),
        EnvVar("TORCH_NCCL_DUMP_ON_TIMEOUT", "1",
               "debug: dump that record when a collective times out"),
        EnvNote("Overrides to try one at a time when isolating a problem; they change performance "
                "and must not stay in production (NCCL docs):"),
        EnvNote(f"export NCCL_ALGO={','.join(algos) or 'Ring'}   # only the algorithms "
                "placer's estimate assumed"),
        EnvNote("export NCCL_PROTO=Simple   # rule out the LL/LL128 protocols"),
    ]
    if any(t.fabric.nvls for t in placement.distinct_node_types):
        lines.append(EnvNote("export NCCL_NVLS_ENABLE=0   # rule out NVLink SHARP"))
    return lines


def _render(lines: list[EnvLine], indent: str = "") -> list[str]:
    out: list[str] = []
    width = 98 - len(indent)
    for line in lines:
        if isinstance(line, EnvNote):
            text = line.text
            # A commented-out command stays on one line so it can be uncommented as is.
            out += ([f"# {text}"] if text.startswith("export ")
                    else comment_block([text], width))
        else:
            checked(line.name, "env", "variable name")
            out += comment_block([line.why], width)
            out.append(f"export {line.name}={single_quoted(line.value)}")
    return [indent + text for text in out]


def render_env_sh(placement: PlacedCandidate, debug: bool = False) -> str:
    """The text of env.sh; launch.sh sets PLACER_NODE_TYPE before sourcing it."""
    layout = placement.layout
    out = ["# shellcheck shell=bash", *comment_block([
        f"env.sh: NCCL and torch environment for job {placement.plan.job.name}, layout {layout}.",
        "Derived by placer from the cluster file (NICs, rails, network) and the plan; sourced by "
        "launch.sh. "
        + ("Includes debugging variables (--debug): remove them for production runs."
           if debug else "Production settings only; NCCL's debugging variables (NCCL_DEBUG, "
           "NCCL_ALGO, NCCL_PROTO, ...) come only with --debug."),
    ]), ""]
    out += _render(common_env(placement))
    per_type = {t.name: node_type_env(placement, t) for t in placement.distinct_node_types}
    if len(per_type) == 1:
        out += _render(next(iter(per_type.values())))
    else:
        names = list(per_type)
        out += ["", "# Mixed node types: launch.sh sets PLACER_NODE_TYPE from the node rank.",
                'case "${PLACER_NODE_TYPE:-}" in']
        for name, lines in per_type.items():
            out.append(f"  {quote(name, 'name', 'node_type')})")
            out += _render(lines, indent="    ")
            out.append("    ;;")
        out += ["  *)",
                f'    echo "env.sh: PLACER_NODE_TYPE must be one of: {" ".join(names)}" >&2',
                "    return 1",
                "    ;;",
                "esac"]
    if debug:
        out += ["", "# --debug: diagnostics (remove for production runs)."]
        out += _render(debug_env(placement))
    return "\n".join(out) + "\n"
