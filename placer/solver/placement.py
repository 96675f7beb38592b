"""Rank -> GPU placement: which physical GPU holds each point of the parallel grid.

A placement maps a logical index of ``MeshGrid(layout, order)`` to a *slot* (a healthy GPU in
torchrun's node-major order; ``placer.topology``). Three families, all checked against the NVLink
rule (every TP group inside one NVLink domain unless the job allows otherwise):

- mesh orders on regular clusters: the identity map under each distinct order (Megatron's
  ``tp-cp-ep-dp-pp`` and its permutations); no remapping is needed at launch;
- node tilings on regular clusters: each node holds a block of the grid with a factor of several
  dims (e.g. tp 2 x dp 2 x pp 2 on 8 GPUs), which no single order produces;
- irregular clusters (failed GPUs, mixed node sizes or types): whole TP groups are cut into
  node-sized runs by the reduced CP-SAT model of ``placer.solver.segments``.

The cost model ranks them; this module only builds them and the rank map.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import overload

from placer.dims import DEFAULT_ORDER, DENSE_DIMS, PART_GROUP, Dim, Group
from placer.mesh import MeshGrid, candidate_orders, order_text
from placer.solver.segments import Edge, Segmentation, assign_runs, segment
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.results import CollectiveCost, RankEntry
from placer.topology import ClusterTopology

WEIGHT_SCALE = 1000
"""Largest integer edge weight of the traffic proxy: bytes per step are scaled so the heaviest
dimension gets this, which keeps CP-SAT's objective small and exact."""

RING_DIMS = (Dim.CP, Dim.DP)
"""Dims whose collectives run as rings (a wrap-around edge); PP is a chain."""


@dataclass(frozen=True)
class Placement:
    """One way to put the grid on the GPUs.

    ``slots[i]`` is the slot of logical index ``i``; None means the identity (slot = index).
    """

    order: tuple[str, ...]
    slots: Sequence[int] | None
    method: str
    note: str
    proxy: Segmentation | None = field(default=None, compare=False)

    @property
    def label(self) -> str:
        return f"{self.method} {order_text(self.order)}" + (f" {self.note}" if self.note else "")


# ----- the NVLink rule ----------------------------------------------------------------------------


def _inner_stride(layout: Layout, order: Sequence[str], dim: str) -> int:
    """Logical-index stride of ``dim`` under ``order`` (product of the sizes inside it)."""
    stride = 1
    for d in order:
        if d == dim:
            return stride
        stride *= getattr(layout, d)
    raise ValueError(dim)


@lru_cache(maxsize=8)
def slot_domains(topology: ClusterTopology) -> tuple[int, ...]:
    """NVLink domain id of every slot, computed once per topology."""
    return tuple(topology.nvlink_domain_of(slot) for slot in range(topology.num_gpus))


@lru_cache(maxsize=256)
def _blocks_inside_domains(topology: ClusterTopology, size: int, stride: int, total: int) -> bool:
    """Whether every group {b + k*stride : k < size} of the identity map lies in one domain.

    Cached per (size, stride): every order with the same TP stride gives the same TP groups.
    """
    if size == 1:
        return True
    domain = slot_domains(topology)
    for base in range(total):
        if (base // stride) % size:
            continue
        first = domain[base]
        if any(domain[base + k * stride] != first for k in range(1, size)):
            return False
    return True


def tp_inside_nvlink(layout: Layout, order: Sequence[str], topology: ClusterTopology,
                     slots: Sequence[int] | None = None) -> bool:
    """Every TP group of the placement within one NVLink domain."""
    if layout.tp == 1:
        return True
    stride = _inner_stride(layout, order, Dim.TP)
    if slots is None:
        return _blocks_inside_domains(topology, layout.tp, stride, layout.num_gpus)
    domain = slot_domains(topology)
    for base in range(layout.num_gpus):
        if (base // stride) % layout.tp:
            continue
        first = domain[slots[base]]
        if any(domain[slots[base + k * stride]] != first for k in range(1, layout.tp)):
            return False
    return True


def tp_capacity(topology: ClusterTopology, job: Job, tp_values: Sequence[int]) -> dict[int, int]:
    """GPUs that can hold TP groups of each size: whole groups per NVLink domain, or, when the
    job lets TP leave NVLink, per node, or over whole nodes when every node has the same
    healthy GPU count (the natural order then spans consecutive nodes). A size that fits
    nowhere is left out."""
    domains: dict[int, int] = {}
    if job.allow_tp_outside_nvlink:
        for node in range(topology.num_nodes):
            domains[node] = len(topology.layout_of(node).healthy)
    else:
        for key in slot_domains(topology):
            domains[key] = domains.get(key, 0) + 1
    counts = set(domains.values())
    out: dict[int, int] = {}
    for tp in tp_values:
        if job.allow_tp_outside_nvlink and tp > max(counts):
            per_node = max(counts)
            if len(counts) == 1 and tp % per_node == 0:
                out[tp] = topology.num_nodes // (tp // per_node) * tp
            continue
        capacity = sum(count // tp * tp for count in domains.values())
        if capacity:
            out[tp] = capacity
    return out


# ----- regular clusters: orders and node tilings --------------------------------------------------


def order_placements(layout: Layout, topology: ClusterTopology, job: Job) -> list[Placement]:
    """Identity placements under every distinct mesh order that keeps the NVLink rule."""
    out = []
    for order in candidate_orders(layout):
        if job.allow_tp_outside_nvlink or tp_inside_nvlink(layout, order, topology):
            out.append(Placement(order, None, "mesh order", ""))
    return out


def node_tiles(layout: Layout, gpus_per_node: int) -> list[dict[str, int]]:
    """Node blocks that no single mesh order gives: TP whole, the rest of the node split over
    at least two other dims, each by a factor that is neither 1 nor the dim's full size (a block
    with at most one such partial dim is what the order 'tp, full dims, partial dim' produces)."""
    tp = layout.tp
    if tp > gpus_per_node or gpus_per_node % tp:
        return []
    others = [d for d in (Dim.CP, Dim.DP, Dim.PP) if getattr(layout, d) > 1]
    tiles: list[dict[str, int]] = []

    def split(index: int, left: int, chosen: dict[str, int]) -> None:
        if index == len(others):
            if left == 1:
                partial = sum(1 for d in others if 1 < chosen[d] < getattr(layout, d))
                if partial >= 2:
                    tiles.append({Dim.TP: tp, **chosen})
            return
        dim = others[index]
        size = getattr(layout, dim)
        for factor in range(1, left + 1):
            if left % factor == 0 and size % factor == 0:
                split(index + 1, left // factor, {**chosen, dim: factor})

    split(0, gpus_per_node // tp, {})
    return [{d: tile.get(d, 1) for d in DENSE_DIMS} for tile in tiles]


@dataclass(frozen=True)
class TileMap(Sequence[int]):
    """Slot of each logical index when every node holds one ``tile`` of the grid.

    Inside a node the tile is laid out in ``order`` (TP innermost: consecutive local GPUs);
    the tiles go to nodes in ``order`` too, so DP peers keep their local index (their rail).
    Computed on access: the cost model reads only a few groups, even at 100,000 GPUs.
    """

    layout: Layout
    tile: tuple[tuple[str, int], ...]
    gpus_per_node: int
    order: tuple[str, ...] = DEFAULT_ORDER

    @cached_property
    def _dims(self) -> list[tuple[int, int, int, int, int]]:
        """(stride, size, tile factor, local multiplier, node multiplier) per dim in order."""
        grid = MeshGrid(self.layout, self.order)
        tile = dict(self.tile)
        out, local_step, node_step = [], 1, 1
        for d in self.order:
            size = grid.sizes[d]
            out.append((grid.strides[d], size, tile[d], local_step, node_step))
            local_step *= tile[d]
            node_step *= size // tile[d]
        return out

    def __len__(self) -> int:
        return self.layout.num_gpus

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        local = node = 0
        for stride, size, factor, local_mult, node_mult in self._dims:
            c = (index // stride) % size
            local += (c % factor) * local_mult
            node += (c // factor) * node_mult
        return node * self.gpus_per_node + local


def tiling_placements(layout: Layout, topology: ClusterTopology, job: Job) -> list[Placement]:
    """Node-tiling placements for a regular cluster (every node the same, none degraded).

    TP stays whole and innermost in each node, so its groups are the natural order's.
    """
    gpus_per_node = topology.num_gpus // topology.num_nodes
    if not (job.allow_tp_outside_nvlink
            or _blocks_inside_domains(topology, layout.tp, 1, layout.num_gpus)):
        return []
    out = []
    for tile in node_tiles(layout, gpus_per_node):
        slots = TileMap(layout, tuple(sorted(tile.items())), gpus_per_node)
        note = "x".join(f"{d}{tile[d]}" for d in DEFAULT_ORDER if tile[d] > 1)
        out.append(Placement(DEFAULT_ORDER, slots, "node tiling", f"(node = {note})"))
    return out


# ----- irregular clusters: the reduced CP-SAT model -----------------------------------------------


@dataclass(frozen=True)
class Bin:
    """A node (or an NVLink domain spanning nodes) as the CP-SAT model sees it."""

    index: int
    domains: tuple[tuple[int, ...], ...]
    """Healthy slots grouped by NVLink domain, each ascending."""
    capacity: int
    """Whole TP groups it can hold."""
    gpus_per_node: int


def bins_for(topology: ClusterTopology, tp: int, job: Job) -> list[Bin]:
    """Bins in node order: nodes, or whole NVLink islands when TP is larger than a node (or,
    when the job lets TP leave NVLink, runs of consecutive nodes)."""
    groups: dict[int, dict[int, list[int]]] = {}
    domains = slot_domains(topology)
    for node in range(topology.num_nodes):
        healthy = topology.layout_of(node).healthy
        key = node
        if tp > len(healthy) and job.allow_tp_outside_nvlink:
            key = node // -(-tp // max(1, len(healthy)))  # consecutive nodes, TP over network
        elif tp > len(healthy) and topology.spans_domain_nodes(node):
            key = topology.island_of(node)
        first = topology.first_slot_of(node)
        for slot in range(first, first + len(healthy)):
            domain = key if job.allow_tp_outside_nvlink else domains[slot]
            groups.setdefault(key, {}).setdefault(domain, []).append(slot)
    out = []
    for key in sorted(groups):
        domains = tuple(tuple(groups[key][d]) for d in sorted(groups[key]))
        capacity = sum(len(d) // tp for d in domains)
        gpn = topology.layout_of(topology.node_of(domains[0][0])).gpus_per_node
        out.append(Bin(key, domains, capacity, gpn))
    return out


def traffic_weights(collectives: Sequence[CollectiveCost]) -> dict[Dim, float]:
    """Bytes per step each dimension moves per rank (ZeRO and expert gradients count with DP:
    the proxy's rings run along the dense dims)."""
    out: dict[Dim, float] = {}
    for c in collectives:
        dim = Dim.DP if PART_GROUP[c.dimension] == Group.DP_CP else Dim(c.dimension)
        out[dim] = out.get(dim, 0.0) + float(c.message_bytes) * c.calls_per_step
    return out


def unit_edges(layout: Layout, order: Sequence[str], weights: Mapping[str, float]) -> list[Edge]:
    """Edges between TP groups (units) that exchange data, weighted by bytes per step.

    Units are consecutive blocks of ``tp`` logical indices (TP must be innermost). Neighbours
    along CP and DP form rings, along PP a chain; EP groups are rings over their units.
    """
    tp = layout.tp
    units = layout.num_gpus // tp
    top = max([w for w in weights.values() if w > 0], default=0.0)
    if top == 0.0:
        return []
    scaled = {d: max(1, round(WEIGHT_SCALE * w / top)) for d, w in weights.items() if w > 0}
    merged: dict[tuple[int, int], int] = {}

    def add(u: int, v: int, w: int) -> None:
        key = (u, v) if u < v else (v, u)
        if key[0] != key[1]:
            merged[key] = merged.get(key, 0) + w

    for dim in (Dim.CP, Dim.DP, Dim.PP):
        size, w = getattr(layout, dim), scaled.get(dim, 0)
        if size == 1 or w == 0:
            continue
        stride = _inner_stride(layout, order, dim) // tp
        for u in range(units):
            c = (u // stride) % size
            if c + 1 < size:
                add(u, u + stride, w)
            elif dim in RING_DIMS and size > 2:
                add(u - (size - 1) * stride, u, w)
    w_ep = scaled.get(Dim.EP, 0)
    if layout.ep > 1 and w_ep:
        for group in MeshGrid(layout, tuple(order)).groups(Group.EP):
            members = sorted({i // tp for i in group})
            for a, b in zip(members, members[1:], strict=False):
                add(a, b, w_ep)
            if len(members) > 2:
                add(members[0], members[-1], w_ep)
    return [(u, v, w) for (u, v), w in sorted(merged.items())]


def _tp_innermost(layout: Layout, order: Sequence[str]) -> bool:
    return _inner_stride(layout, order, Dim.TP) == 1


def _place_units(layout: Layout, lengths: Sequence[int], bins: Sequence[Bin],
                 bin_of_run: Sequence[int], topology: ClusterTopology) -> tuple[int, ...]:
    """Slots of every logical index: each run's units go to its bin, TP groups whole in one
    NVLink domain. A unit prefers the local GPUs its position would have on a full node (so DP
    peers keep sharing a NIC rail), else the lowest free GPUs of the first domain that fits it."""
    tp = layout.tp
    slots = [0] * layout.num_gpus
    start = 0
    for run, length in enumerate(lengths):
        b = bins[bin_of_run[run]]
        free = [[(slot, topology.locate(slot)[1]) for slot in domain] for domain in b.domains]
        for unit in range(start, start + length):
            wanted = [(unit * tp + k) % b.gpus_per_node for k in range(tp)]
            pick = next((d for d in free if [g for _, g in d if g in wanted] == wanted), None)
            if pick is not None:
                chosen = [entry for entry in pick if entry[1] in wanted]
            else:
                pick = next(d for d in free if len(d) >= tp)
                chosen = pick[:tp]
            for entry in chosen:
                pick.remove(entry)
            for k, (slot, _) in enumerate(chosen):
                slots[unit * tp + k] = slot
        start += length
    return tuple(slots)


def irregular_placements(layout: Layout, topology: ClusterTopology, job: Job,
                         weights: Mapping[str, float], *,
                         time_limit_s: float) -> list[Placement]:
    """CP-SAT placements (one per mesh order with TP innermost) on an irregular cluster."""
    bins = bins_for(topology, layout.tp, job)
    capacities = [b.capacity for b in bins]
    units = layout.num_gpus // layout.tp
    orders = [o for o in candidate_orders(layout) if _tp_innermost(layout, o)]
    out = []
    for order in orders:
        edges = unit_edges(layout, order, weights)
        result = segment(units, edges, capacities, time_limit_s=time_limit_s / len(orders))
        if result is None:
            continue
        bin_of_run = assign_runs(result.lengths, capacities)
        slots = _place_units(layout, result.lengths, bins, bin_of_run, topology)
        note = (f"(traffic proxy {result.cut_weight}, bound {result.bound}, "
                f"{result.status.lower()}; structured fill {result.hint_cut_weight})")
        out.append(Placement(order, slots, "cp-sat", note, result))
    return out


# ----- the rank map -------------------------------------------------------------------------------


def rank_map(layout: Layout, placement: Placement, topology: ClusterTopology) -> list[RankEntry]:
    """One entry per rank: torchrun numbers the used GPUs node by node, ascending GPU index."""
    size = layout.num_gpus
    if placement.slots is None:
        logical_at: Mapping[int, int] = _Identity(size)
    else:
        logical_at = {slot: logical for logical, slot in enumerate(placement.slots)}
    where: list[tuple[int, int, int]] = []  # (node, local rank, GPU) of each rank
    logicals: list[int] = []
    for node in sorted({topology.node_of(slot) for slot in _node_firsts(logical_at, topology)}):
        first = topology.first_slot_of(node)
        local_rank = 0
        for offset, gpu in enumerate(topology.layout_of(node).healthy):
            logical = logical_at.get(first + offset)
            if logical is None:
                continue
            where.append((node, local_rank, gpu))
            logicals.append(logical)
            local_rank += 1
    coords = MeshGrid(layout, placement.order).coords_of(logicals)
    return [_rank_entry(rank, node, local_rank, gpu, at)
            for rank, ((node, local_rank, gpu), at) in enumerate(zip(where, coords, strict=True))]


_RANK_ENTRY_FIELDS = frozenset(RankEntry.model_fields)
_new_entry = RankEntry.__new__
_set = object.__setattr__


def _rank_entry(rank: int, node: int, local_rank: int, gpu: int,
                coords: dict[str, int]) -> RankEntry:
    """``RankEntry.model_construct(...)`` of trusted values, left exactly as it leaves one
    (pydantic 2: the field values, every field set, no extras, no private attributes) without
    its per-field lookups: half the time, for 100,000 entries per candidate at 100,000 GPUs
    (tests/test_solver_placement.py compares the two)."""
    entry = _new_entry(RankEntry)
    _set(entry, "__dict__", {"rank": rank, "node": node, "local_rank": local_rank, "gpu": gpu,
                             "coords": coords})
    _set(entry, "__pydantic_fields_set__", set(_RANK_ENTRY_FIELDS))
    _set(entry, "__pydantic_extra__", None)
    _set(entry, "__pydantic_private__", None)
    return entry


class _Identity(Mapping[int, int]):
    """Slot ``i`` holds logical index ``i`` for every ``i < size`` (the natural placement),
    without a 100,000-entry dict."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __getitem__(self, slot: int) -> int:
        if 0 <= slot < self.size:
            return slot
        raise KeyError(slot)

    def get(self, slot: int, default: int | None = None) -> int | None:  # type: ignore[override]
        return slot if 0 <= slot < self.size else default

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.size))

    def __len__(self) -> int:
        return self.size


def _node_firsts(logical_at: Mapping[int, int], topology: ClusterTopology) -> list[int]:
    """One used slot per used node (cheap: skips the rest of a node's slots)."""
    out, next_node_slot = [], -1
    for slot in sorted(logical_at):
        if slot >= next_node_slot:
            out.append(slot)
            node = topology.node_of(slot)
            next_node_slot = (topology.first_slot_of(node + 1) if node + 1 < topology.num_nodes
                              else topology.num_gpus)
    return out
