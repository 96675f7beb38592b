"""Placement: node tilings, the reduced CP-SAT model, irregular clusters, rank maps.

Every placement on an irregular cluster is checked against the cluster itself: each rank on a
distinct healthy GPU, every group of every dimension a partition of the ranks, every TP group
inside one node and one NVLink domain.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from placer.dims import DEFAULT_ORDER
from placer.dims import GROUPS as GROUP_DIMS
from placer.mesh import MeshGrid, candidate_orders
from placer.solver.placement import (
    TileMap,
    bins_for,
    irregular_placements,
    node_tiles,
    order_placements,
    rank_map,
    tp_capacity,
    unit_edges,
)
from placer.solver.segments import (
    assign_runs,
    best_structured_lengths,
    block_lengths,
    cut_weight_of,
    internal_weights,
    segment,
)
from placer.spec import Cluster, Job, Layout
from placer.spec.presets import cluster_preset
from placer.spec.results import RankEntry
from placer.topology import topology_of

JOB = Job(seq_len=4096, global_batch_size=960)
FAILED = ((3, 2), (10, 7), (20, 0), (33, 5), (50, 3))


def _degraded(nodes: int = 64, failed: tuple[tuple[int, int], ...] = FAILED) -> Cluster:
    data = cluster_preset("dgx-h100").with_nodes(nodes).model_dump()
    data["excluded_gpus"] = [{"node": n, "gpu": g} for n, g in failed]
    return Cluster.model_validate(data)


def _check_valid(cluster: Cluster, layout: Layout, order: tuple[str, ...], entries: list) -> None:
    """The rank map of a placement is a valid, launchable map of this cluster."""
    topology = topology_of(cluster)
    assert len(entries) == layout.num_gpus
    assert [e.rank for e in entries] == list(range(layout.num_gpus))
    gpus = [(e.node, e.gpu) for e in entries]
    assert len(set(gpus)) == len(gpus)
    for e in entries:
        assert e.gpu in cluster.healthy_gpus(e.node)
    by_node: dict[int, list] = {}
    for e in entries:
        by_node.setdefault(e.node, []).append(e)
    for members in by_node.values():
        assert [m.local_rank for m in members] == list(range(len(members)))
        assert [m.gpu for m in members] == sorted(m.gpu for m in members)
    grid = MeshGrid(layout, order)
    logical_of_rank = [grid.logical_index(e.coords) for e in entries]
    assert sorted(logical_of_rank) == list(range(layout.num_gpus))
    for rank, logical in enumerate(logical_of_rank):
        assert entries[rank].coords == grid.coords(logical)
    rank_of_logical = {logical: rank for rank, logical in enumerate(logical_of_rank)}
    for dim in GROUP_DIMS:
        seen = Counter(r for g in grid.groups(dim) for r in (rank_of_logical[i] for i in g))
        assert set(seen.values()) == {1} and len(seen) == layout.num_gpus
    for group in grid.groups("tp"):
        members = [entries[rank_of_logical[i]] for i in group]
        assert len({m.node for m in members}) == 1
        slots = [topology.slot_of(m.node, m.gpu) for m in members]
        assert len({topology.nvlink_domain_of(s) for s in slots}) == 1


def test_tp_capacity_counts_whole_groups_per_node() -> None:
    caps = tp_capacity(topology_of(_degraded()), JOB, [1, 2, 4, 8])
    # 59 healthy nodes of 8 plus 5 nodes of 7 healthy GPUs.
    assert caps == {1: 507, 2: 59 * 8 + 5 * 6, 4: 59 * 8 + 5 * 4, 8: 59 * 8}


@pytest.mark.parametrize("tp, pp, dp, cp", [(4, 4, 15, 2), (8, 4, 14, 1), (1, 10, 48, 1),
                                            (2, 8, 15, 2)])
def test_irregular_placements_are_valid_on_the_cluster(tp: int, pp: int, dp: int,
                                                       cp: int) -> None:
    cluster = _degraded()
    topology = topology_of(cluster)
    layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp)
    placements = irregular_placements(layout, topology, JOB, {"dp": 2.0, "pp": 1.0, "cp": 3.0},
                                      time_limit_s=2.0)
    assert placements
    for placement in placements:
        assert placement.proxy is not None
        assert placement.proxy.bound <= placement.proxy.cut_weight
        assert placement.proxy.cut_weight <= placement.proxy.hint_cut_weight
        entries = rank_map(layout, placement, topology)
        _check_valid(cluster, layout, placement.order, entries)
        used = {(e.node, e.gpu) for e in entries}
        assert all((n, g) not in used for n, g in FAILED)


def test_tp8_groups_skip_nodes_with_a_failed_gpu() -> None:
    cluster = _degraded(nodes=8, failed=((2, 5),))
    topology = topology_of(cluster)
    layout = Layout(tp=8, pp=7, dp=1)
    placement = irregular_placements(layout, topology, JOB, {"pp": 1.0}, time_limit_s=2.0)[0]
    entries = rank_map(layout, placement, topology)
    _check_valid(cluster, layout, placement.order, entries)
    assert 2 not in {e.node for e in entries}


def test_bins_of_an_nvl72_rack_join_trays_only_when_tp_needs_it() -> None:
    topology = topology_of(cluster_preset("gb200-nvl72"))
    assert len(bins_for(topology, 4, JOB)) == 18
    rack = bins_for(topology, 8, JOB)
    assert len(rack) == 1 and rack[0].capacity == 9


def test_segment_matches_enumeration_of_every_chunking() -> None:
    """The CP-SAT optimum and its bound equal the best of all ways to cut 10 units."""
    units = 10
    edges = [(u, u + 1, 3) for u in range(units - 1)] + [(u, u + 5, 10) for u in range(5)]
    capacities = [4, 4, 3, 2]
    result = segment(units, edges, capacities, time_limit_s=5.0)
    assert result is not None and result.status == "OPTIMAL"
    inner = internal_weights(units, edges, max(capacities))
    total = sum(w for _, _, w in edges)
    best = None
    for cuts in range(1 << (units - 1)):
        lengths, run = [], 1
        for i in range(units - 1):
            if cuts >> i & 1:
                lengths.append(run)
                run = 1
            else:
                run += 1
        lengths.append(run)
        try:
            assign_runs(lengths, capacities)
        except ValueError:
            continue
        if len(lengths) > len(capacities):
            continue
        cut = cut_weight_of(lengths, inner, total)
        best = cut if best is None else min(best, cut)
    assert result.cut_weight == best == result.bound


def test_segment_refuses_units_beyond_capacity() -> None:
    assert segment(10, [], [4, 4], time_limit_s=1.0) is None


def test_unit_edges_follow_the_grid() -> None:
    layout = Layout(tp=2, pp=2, dp=3)
    edges = unit_edges(layout, DEFAULT_ORDER, {"dp": 1.0, "pp": 2.0})
    # Units in order (dp inner, pp outer): DP rings 0-1-2-0 and 3-4-5-3, PP chain u -> u+3.
    assert edges == [(0, 1, 500), (0, 2, 500), (0, 3, 1000), (1, 2, 500), (1, 4, 1000),
                     (2, 5, 1000), (3, 4, 500), (3, 5, 500), (4, 5, 500)]


def test_node_tiles_are_only_blocks_no_order_gives() -> None:
    assert node_tiles(Layout(tp=8, pp=4, dp=4), 8) == []
    tiles = node_tiles(Layout(tp=2, pp=4, dp=4), 8)
    assert {"tp": 2, "cp": 1, "dp": 2, "pp": 2} in tiles
    assert all(sum(1 for d in ("dp", "pp") if 1 < t[d] < 4) >= 2 for t in tiles)


def test_tile_map_puts_one_tile_on_each_node() -> None:
    layout = Layout(tp=2, pp=4, dp=4)
    tile = {"tp": 2, "cp": 1, "dp": 2, "pp": 2}
    slots = TileMap(layout, tuple(sorted(tile.items())), 8)
    assert sorted(slots) == list(range(32))
    grid = MeshGrid(layout)
    for node in range(4):
        members = [grid.coords(i) for i in range(32) if slots[i] // 8 == node]
        shape = {d: len({c[d] for c in members}) for d in ("tp", "dp", "pp")}
        assert shape == {"tp": 2, "dp": 2, "pp": 2}
    # TP pairs stay on consecutive GPUs, so they share the node's NVLink.
    assert all(slots[i + 1] == slots[i] + 1 for i in range(0, 32, 2))


def test_orders_that_split_tp_across_nodes_are_dropped() -> None:
    topology = topology_of(cluster_preset("dgx-h100").with_nodes(4))
    layout = Layout(tp=4, pp=2, dp=4)
    kept = {p.order for p in order_placements(layout, topology, JOB)}
    assert DEFAULT_ORDER in kept
    # TP peers ``stride`` ranks apart share an 8-GPU node only when stride x 4 <= 8.
    assert all(MeshGrid(layout, o).strides["tp"] * 4 <= 8 for o in kept)
    assert kept < set(candidate_orders(layout))


@pytest.mark.parametrize("layout, order", [
    (Layout(tp=2, pp=2, dp=2, cp=2), ("tp", "cp", "dp", "pp")),
    (Layout(tp=2, pp=3, dp=4, ep=4, etp=1), ("pp", "tp", "dp", "cp")),
    (Layout(tp=4, pp=1, dp=4, cp=2, ep=8, etp=2), ("cp", "tp", "dp", "pp")),
])
def test_fast_coords_equal_the_mesh_grid(layout: Layout, order: tuple[str, ...]) -> None:
    grid = MeshGrid(layout, order)
    indices = [*range(layout.num_gpus)][::-1]
    assert grid.coords_of(indices) == [grid.coords(i) for i in indices]
    assert list(grid.coords_of([3])[0]) == list(grid.coords(3))  # the same keys, in order


def test_rank_entries_are_what_model_construct_makes() -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    layout = Layout(tp=2, pp=2, dp=4)
    entry = rank_map(layout, order_placements(layout, topology_of(cluster), JOB)[0],
                     topology_of(cluster))[5]
    made = RankEntry.model_construct(**entry.__dict__)
    assert entry == made and vars(entry) == vars(made)
    assert entry.model_fields_set == made.model_fields_set
    assert entry.model_dump_json() == made.model_dump_json()
    assert RankEntry.model_validate(entry.model_dump()) == entry


def test_rank_map_of_the_natural_placement_is_the_identity() -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    topology = topology_of(cluster)
    layout = Layout(tp=4, pp=2, dp=2)
    placement = order_placements(layout, topology, JOB)[0]
    entries = rank_map(layout, placement, topology)
    assert [(e.node, e.gpu) for e in entries] == list(itertools.product(range(2), range(8)))
    assert [MeshGrid(layout).logical_index(e.coords) for e in entries] == list(range(16))


def test_a_node_short_of_a_gpu_does_not_split_the_groups_after_it() -> None:
    # 24 units in rings of 8 (CP groups) on bins of 8, 8, 7, 8 GPUs: filling in order splits
    # the third ring over two nodes; whole blocks of 8 skip the short node and split none.
    edges = [(u, u + 1, 10) for u in range(24) if u % 8 != 7]
    edges += [(u, u + 7, 10) for u in range(0, 24, 8)]
    capacities = [8, 8, 7, 8]
    inner = internal_weights(24, edges, 8)
    total = sum(w for _, _, w in edges)
    assert block_lengths(24, capacities, 8) == (8, 8, 8)
    assert cut_weight_of((8, 8, 7, 1), inner, total) > 0
    assert best_structured_lengths(24, capacities, inner, total, 8) == (8, 8, 8)
    assert cut_weight_of((8, 8, 8), inner, total) == 0
    assert assign_runs((8, 8, 8), capacities) == [0, 1, 3]
    result = segment(24, edges, capacities, time_limit_s=1.0)
    assert result is not None and result.cut_weight == 0
