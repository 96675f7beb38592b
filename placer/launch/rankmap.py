"""From a plan's candidate to torchrun's ranks, and the ``rankmap.json`` document.

torchrun with the static rendezvous numbers ranks node by node: ``rank = (ranks on lower nodes)
+ local_rank`` (docs/sources.md 1.3), and local rank ``i`` runs on the ``i``-th device of the
node's ``CUDA_VISIBLE_DEVICES``, which placer sets to the node's used GPUs in ascending order
(failed or excluded GPUs are left out). The plan's placement, a grid coordinate per physical GPU,
is therefore a permutation between grid points (logical indices of ``MeshGrid``) and torchrun
ranks; ``rankmap.json`` carries it as the explicit DeviceMesh ``mesh`` tensor that placer_mesh.py
builds its groups from (docs/sources.md 1.4, option 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from placer.dims import DENSE_DIMS, GROUPS, Dim
from placer.errors import InputError, PlacerError
from placer.mesh import MeshGrid, order_text, parse_order, torchrun_numbering
from placer.spec import Candidate, Layout, NodeType, Plan, validate_layout
from placer.spec.documents import RANKMAP_FORMAT, RankMapDocument, document

FORMAT = RANKMAP_FORMAT
# Coordinates written per rank: the mesh dims, then the expert grid.
COORD_DIMS = (Dim.PP, Dim.DP, Dim.CP, Dim.TP, Dim.EP, Dim.ETP, Dim.EDP)


@dataclass(frozen=True)
class LaunchNode:
    """One torchrun node: its launch rank (``--node-rank``), the cluster node it runs on."""

    index: int
    cluster_node: int
    node_type: NodeType
    hostname: str | None
    gpus: tuple[int, ...]

    @property
    def num_ranks(self) -> int:
        return len(self.gpus)

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


@dataclass(frozen=True)
class RankSlot:
    """One torchrun rank: where it runs and which grid point (logical index) it holds."""

    rank: int
    node: int
    local_rank: int
    gpu: int
    logical: int


@dataclass(frozen=True)
class PlacedCandidate:
    """A checked candidate: its grid, its nodes, and torchrun rank <-> grid point both ways."""

    plan: Plan
    candidate_index: int
    grid: MeshGrid
    nodes: tuple[LaunchNode, ...]
    slots: tuple[RankSlot, ...]

    @property
    def candidate(self) -> Candidate:
        return self.plan.candidates[self.candidate_index]

    @property
    def layout(self) -> Layout:
        return self.grid.layout

    @property
    def world_size(self) -> int:
        return len(self.slots)

    @cached_property
    def rank_of_logical(self) -> tuple[int, ...]:
        ranks = [0] * self.world_size
        for slot in self.slots:
            ranks[slot.logical] = slot.rank
        return tuple(ranks)

    @property
    def is_identity(self) -> bool:
        """True when torchrun rank r holds grid point r (no remapping needed)."""
        return all(slot.rank == slot.logical for slot in self.slots)

    @property
    def mesh_dim_names(self) -> list[str]:
        """Mesh dims outermost first (the reverse of the innermost-first mesh order)."""
        return list(reversed(self.grid.order))

    @cached_property
    def groups(self) -> dict[str, list[list[int]]]:
        """Every group of every dimension in torchrun ranks, each sorted, ordered by first rank."""
        out: dict[str, list[list[int]]] = {}
        for dim in GROUPS:
            groups = [sorted(self.rank_of_logical[i] for i in g) for g in self.grid.groups(dim)]
            out[dim] = sorted(groups, key=lambda g: g[0])
        return out

    def coords(self, rank: int) -> dict[str, int]:
        full = self.grid.coords(self.slots[rank].logical)
        return {dim: full[dim] for dim in COORD_DIMS}

    @property
    def distinct_node_types(self) -> list[NodeType]:
        seen: dict[str, NodeType] = {}
        for node in self.nodes:
            seen.setdefault(node.node_type.name, node.node_type)
        return list(seen.values())


def placement_of(plan: Plan, candidate_index: int = 0) -> PlacedCandidate:
    """Check candidate ``candidate_index`` of ``plan`` and derive torchrun's view of it.

    Raises PlacerError when the plan cannot be launched as written: an index out of range, a
    layout that breaks a framework rule, or a rank map that is not a one-to-one placement on
    healthy GPUs consistent with torchrun's numbering.
    """
    if not plan.candidates:
        raise PlacerError("the plan has no candidates; run recommend-layout again")
    if not 0 <= candidate_index < len(plan.candidates):
        raise InputError("--candidate", candidate_index,
                         f"the plan has candidates 0..{len(plan.candidates) - 1}")
    candidate = plan.candidates[candidate_index]
    where = f"candidates[{candidate_index}]"
    layout = candidate.layout
    validate_layout(layout, plan.model, plan.job, layout.num_gpus)
    _check_stage_layers(candidate.stage_layers, layout, plan.model.num_layers, where)
    order = parse_order(candidate.mesh_order)
    grid = MeshGrid(layout, order)
    cluster = plan.cluster
    entries = candidate.rank_map
    if len(entries) != layout.num_gpus:
        raise PlacerError(f"{where}.rank_map: has {len(entries)} entries, but the layout "
                          f"{layout} needs {layout.num_gpus} ranks")
    logical_at: dict[tuple[int, int], int] = {}
    seen_logical: dict[int, int] = {}
    for k, entry in enumerate(entries):
        field = f"{where}.rank_map[{k}]"
        if not 0 <= entry.node < cluster.num_nodes:
            raise InputError(f"{field}.node", entry.node,
                             f"the cluster has nodes 0..{cluster.num_nodes - 1}")
        if entry.gpu not in cluster.healthy_gpus(entry.node):
            raise InputError(f"{field}.gpu", entry.gpu,
                             f"node {entry.node} has healthy GPUs "
                             f"{list(cluster.healthy_gpus(entry.node))}")
        if (entry.node, entry.gpu) in logical_at:
            raise InputError(f"{field}.gpu", entry.gpu,
                             f"GPU {entry.gpu} of node {entry.node} is used by two ranks")
        logical = _logical_index(grid, entry.coords, field)
        if logical in seen_logical:
            raise InputError(f"{field}.coords", entry.coords,
                             f"rank_map[{seen_logical[logical]}] has the same coordinates")
        seen_logical[logical] = k
        logical_at[(entry.node, entry.gpu)] = logical
    nodes = _launch_nodes(plan, sorted({node for node, _ in logical_at}), logical_at)
    slots = _slots(nodes, logical_at)
    _check_numbering(entries, nodes, slots, where)
    return PlacedCandidate(plan, candidate_index, grid, tuple(nodes), tuple(slots))


def _check_stage_layers(stage_layers: list[int] | None, layout: Layout, num_layers: int,
                        where: str) -> None:
    """An uneven pipeline split must give every stage a layer and cover the model exactly."""
    if stage_layers is None:
        return
    field = f"{where}.stage_layers"
    if len(stage_layers) != layout.pp:
        raise InputError(field, stage_layers, f"list one layer count per stage (pp={layout.pp})")
    if min(stage_layers) < 1 or sum(stage_layers) != num_layers:
        raise InputError(field, stage_layers,
                         f"counts must be >= 1 and add up to num_layers={num_layers}")


def _logical_index(grid: MeshGrid, coords: dict[str, int], field: str) -> int:
    for dim in DENSE_DIMS:
        size = grid.sizes[dim]
        value = coords.get(dim, 0 if size == 1 else None)
        if value is None or not 0 <= value < size:
            raise InputError(f"{field}.coords.{dim}", value, f"must be in 0..{size - 1}")
    logical = grid.logical_index({d: coords.get(d, 0) for d in DENSE_DIMS})
    expected = grid.coords(logical)
    for dim, value in coords.items():
        if dim not in expected:
            raise InputError(f"{field}.coords", dim, f"coordinates are {', '.join(expected)}")
        if value != expected[dim]:
            raise InputError(f"{field}.coords.{dim}", value,
                             f"the grid puts this point at {dim}={expected[dim]}")
    return logical


def _launch_nodes(plan: Plan, used: list[int],
                  logical_at: dict[tuple[int, int], int]) -> list[LaunchNode]:
    infos = plan.cluster.nodes()
    gpus_of: dict[int, list[int]] = {}
    for node, gpu in logical_at:
        gpus_of.setdefault(node, []).append(gpu)
    return [LaunchNode(index, node, infos[node].node_type, infos[node].hostname,
                       tuple(sorted(gpus_of[node])))
            for index, node in enumerate(used)]


def _slots(nodes: list[LaunchNode], logical_at: dict[tuple[int, int], int]) -> list[RankSlot]:
    index = {node.cluster_node: node.index for node in nodes}
    return [RankSlot(rank, index[node], local, gpu, logical_at[(node, gpu)])
            for (node, gpu), (rank, local) in torchrun_numbering(logical_at).items()]


def _check_numbering(entries: Any, nodes: list[LaunchNode], slots: list[RankSlot],
                     where: str) -> None:
    """The plan's rank and local_rank must be the ones torchrun will assign to that GPU."""
    by_gpu = {(nodes[s.node].cluster_node, s.gpu): s for s in slots}
    for k, entry in enumerate(entries):
        slot = by_gpu[(entry.node, entry.gpu)]
        if (entry.rank, entry.local_rank) != (slot.rank, slot.local_rank):
            raise PlacerError(
                f"{where}.rank_map[{k}]: node {entry.node} GPU {entry.gpu} is listed as rank "
                f"{entry.rank} local_rank {entry.local_rank}, but torchrun's static rendezvous "
                f"gives it rank {slot.rank} local_rank {slot.local_rank} (ranks node by node, "
                "local ranks in ascending GPU order); regenerate the plan"
            )


def _nested(flat: tuple[int, ...], shape: list[int]) -> Any:
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_nested(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def rankmap_document(placement: PlacedCandidate) -> dict[str, Any]:
    """The ``placer-rankmap/1`` document that placer_mesh.py validates and builds groups from.

    ``mesh`` is nested outermost-first like ``mesh_dim_names``; flattened row-major it lists the
    torchrun rank of each logical index, so the innermost dim holds the fastest-varying points.
    """
    names = placement.mesh_dim_names
    shape = [placement.grid.sizes[d] for d in names]
    groups = placement.groups
    group_id = {dim: {r: gid for gid, g in enumerate(gs) for r in g} for dim, gs in groups.items()}
    ranks = [
        {
            "rank": slot.rank,
            "node": slot.node,
            "local_rank": slot.local_rank,
            "gpu": slot.gpu,
            "coords": placement.coords(slot.rank),
            "groups": {dim: group_id[dim][slot.rank] for dim in GROUPS},
        }
        for slot in placement.slots
    ]
    nodes = [
        {
            "index": node.index,
            "num_ranks": node.num_ranks,
            "cuda_visible_devices": node.cuda_visible_devices,
            "cluster_node": node.cluster_node,
            "hostname": node.hostname,
            "node_type": node.node_type.name,
        }
        for node in placement.nodes
    ]
    return document(RankMapDocument, {
        "format": FORMAT,
        "job": placement.plan.job.name,
        "layout": placement.layout.compact(),
        "mesh_order": order_text(placement.grid.order),
        "world_size": placement.world_size,
        "backend_hint": "nccl",
        "mesh_dim_names": names,
        "mesh_shape": shape,
        "mesh": _nested(placement.rank_of_logical, shape),
        "nodes": nodes,
        "ranks": ranks,
        "groups": groups,
    })
