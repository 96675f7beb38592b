"""Speed and memory of placer.topology on DGX H100 clusters of 1,024 / 16,384 / 100,000 GPUs.

Prints: topology construction, group_link on a TP, DP and PP group (first call, mean over
distinct uncached translates, and a cached repeat), ring_bottleneck, graph build, one graph path,
and peak Python memory (tracemalloc, measured in a separate pass so it does not skew the timings).

    .venv/bin/python bench/topology_speed.py
"""

from __future__ import annotations

import gc
import resource
import time
import tracemalloc
from collections.abc import Callable

from placer.mesh import MeshGrid
from placer.spec.layout import Layout
from placer.spec.presets import cluster_preset
from placer.topology.cluster_topology import ClusterTopology

NODE_COUNTS = (128, 2048, 12_500)  # x 8 GPUs: 1,024 / 16,384 / 100,000
TP, PP = 8, 4
TRANSLATES = 64


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def groups_for(num_gpus: int) -> dict[str, list[int]]:
    """The rank-0 TP, DP and PP groups of tp=8, pp=4, dp=rest under the natural placement."""
    grid = MeshGrid(Layout(tp=TP, pp=PP, dp=num_gpus // (TP * PP)))
    return {dim: grid.representative_group(dim) for dim in ("tp", "dp", "pp")}


def translate(group: list[int], dim: str, k: int, num_gpus: int) -> list[int]:
    """A distinct group of the same dimension (so the query cache does not answer)."""
    shift = {"tp": TP * k, "dp": k % TP, "pp": k}[dim]
    return [(s + shift) % num_gpus for s in group]


def bench_size(nodes: int) -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(nodes)
    num_gpus = nodes * 8
    gc.collect()
    start = time.perf_counter()
    topo = ClusterTopology(cluster)
    build_s = time.perf_counter() - start
    groups = groups_for(num_gpus)
    first_query_s = timed(lambda: topo.group_link(groups["tp"]))
    print(f"\n{num_gpus:,} GPUs ({nodes:,} nodes): topology {build_s * 1e3:.2f} ms, "
          f"topology + first TP query {(build_s + first_query_s) * 1e3:.2f} ms")
    for dim, group in groups.items():
        topo_fresh = ClusterTopology(cluster)
        cold_s = timed(lambda g=group, t=topo_fresh: t.group_link(g))
        count = TP - 1 if dim == "dp" else TRANSLATES  # dp: the other local GPU indices
        variants = [translate(group, dim, k, num_gpus) for k in range(1, count + 1)]
        start = time.perf_counter()
        for g in variants:
            topo_fresh.group_link(g)
        uncached_s = (time.perf_counter() - start) / len(variants)
        cached_s = timed(lambda g=group, t=topo_fresh: t.group_link(g))
        ring_s = timed(lambda g=group, t=topo_fresh: t.ring_bottleneck(g))
        link = topo_fresh.group_link(group)
        print(f"  {dim}: {len(group):>5} GPUs on {link.num_nodes:>5} nodes  "
              f"group_link first {cold_s * 1e6:9.1f} us, uncached mean {uncached_s * 1e6:9.1f} us"
              f", cached {cached_s * 1e6:6.1f} us; ring_bottleneck {ring_s * 1e6:9.1f} us  "
              f"[{link.link_class}, inter {link.inter_bytes_per_s / 1e9:g} GB/s]")
    graph_s = timed(lambda: topo.graph)
    graph = topo.graph
    path_s = timed(lambda: topo.path(0, num_gpus - 1))
    print(f"  graph: {graph_s:.3f} s for {graph.number_of_nodes():,} vertices and "
          f"{graph.number_of_edges():,} edges; one path() {path_s * 1e3:.1f} ms")


def peak_memory(nodes: int) -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(nodes)
    gc.collect()
    tracemalloc.start()
    topo = ClusterTopology(cluster)
    for group in groups_for(nodes * 8).values():
        topo.group_link(group)
    queries_peak = tracemalloc.get_traced_memory()[1]
    topo.graph  # noqa: B018 - build it
    graph_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"  {nodes * 8:>7,} GPUs: peak {queries_peak / 2**20:8.2f} MiB for topology + queries, "
          f"{graph_peak / 2**20:8.1f} MiB with the graph")


def main() -> None:
    print("placer.topology speed (dgx-h100 preset scaled with .with_nodes; "
          f"layout tp={TP}, pp={PP}, dp=rest)")
    for nodes in NODE_COUNTS:
        bench_size(nodes)
    print("\npeak Python memory (tracemalloc):")
    for nodes in NODE_COUNTS:
        peak_memory(nodes)
    max_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process max RSS: {max_rss_mib:.0f} MiB")


if __name__ == "__main__":
    main()
