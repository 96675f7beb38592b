"""Calibration microbenchmarks, run on every rank under torchrun.

Usage (placer calibrate writes CONFIG and prints this command for real multi-node runs)::

    torchrun <your launcher flags> .../placer/verify/workers/bench.py CONFIG.json OUT_DIR

It times the collectives of the config over one group per (link class, group size), one group at a
time with every other rank idle, and a square-GEMM sweep on all ranks at once (ranks of one node
share whatever they share in training: cores on a CPU box, nothing on GPUs). Rank 0 writes
``OUT_DIR/bench.json``; ``placer calibrate --from OUT_DIR/bench.json`` fits a profile from it.

Groups come from where the ranks really run (torchrun's GROUP_RANK, else the host name), so the
file works under any launcher: intra-node groups are the first ranks of node 0, inter-node groups
the first rank of each of the first nodes.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from placer.verify.workers.common import (
    barrier,
    gemm_call,
    gemm_dtype,
    init_runtime,
    make_collective,
    max_over,
    timed,
    write_json,
)


def node_members(world_size: int) -> list[list[int]]:
    """Global ranks grouped by node, nodes ordered by their lowest rank (collective call)."""
    key = os.environ.get("GROUP_RANK") or socket.gethostname()
    keys: list[Any] = [None] * world_size
    dist.all_gather_object(keys, key)
    nodes: dict[str, list[int]] = {}
    for rank, k in enumerate(keys):
        nodes.setdefault(str(k), []).append(rank)
    return sorted(nodes.values(), key=lambda ranks: ranks[0])


def group_ranks(nodes: list[list[int]], link_class: str, size: int) -> list[int] | None:
    """Ranks of the measured group, or None when the job has too few ranks for it."""
    if link_class == "intra_node":
        return nodes[0][:size] if len(nodes[0]) >= size else None
    if link_class == "inter_node":
        return [members[0] for members in nodes[:size]] if len(nodes) >= size else None
    raise ValueError(f"unknown link class {link_class!r}")


def call_count(first_call_s: float, min_batch_s: float, max_calls: int) -> int:
    """Calls per timed batch: enough to last ``min_batch_s``, at least 1."""
    return max(1, min(max_calls, math.ceil(min_batch_s / max(first_call_s, 1e-9))))


def measure_collectives(config: dict[str, Any], rt: Any, nodes: list[list[int]]) -> list[Any]:
    tests = []
    for test in config["tests"]:
        ranks = group_ranks(nodes, test["link_class"], test["group_size"])
        if ranks is not None:
            tests.append((test, ranks))
    groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
    for _, ranks in tests:  # new_group is collective: same calls, same order, on every rank
        if tuple(ranks) not in groups:
            groups[tuple(ranks)] = dist.new_group(ranks=ranks)
    results = []
    for test, ranks in tests:
        group = groups[tuple(ranks)]
        points = []
        if rt.rank in ranks:
            for nbytes in test["sizes_bytes"]:
                points.append(time_one(test["collective"], nbytes, group, ranks, rt, config))
        results.append({**test, "ranks": ranks, "points": points})
        barrier(None, rt.device)  # idle ranks wait here, so one group runs at a time
    return [r for r in results if r["points"] and rt.rank == r["ranks"][0]]


def time_one(collective: str, nbytes: int, group: dist.ProcessGroup, ranks: list[int], rt: Any,
             config: dict[str, Any]) -> dict[str, Any]:
    """Per-call seconds of each timed batch (the slowest member's batch time / calls)."""
    peer = None
    if collective == "send_recv":
        if rt.rank not in ranks[:2]:
            return {"size_bytes": nbytes, "times_s": []}
        peer = ranks[1] if rt.rank == ranks[0] else ranks[0]
        ranks = ranks[:2]
    call, real_bytes = make_collective(collective, nbytes, group, ranks, rt.rank, rt.device, peer)
    barrier(group, rt.device)
    first = max_over(timed(call, 1, rt.device), group, rt.device)
    count = call_count(first, config["min_batch_s"], config["max_calls"])
    times = []
    for _ in range(config["batches"]):
        barrier(group, rt.device)
        elapsed = timed(call, count, rt.device)
        times.append(max_over(elapsed, group, rt.device) / count)
    return {"size_bytes": real_bytes, "calls_per_batch": count, "times_s": times}


def measure_gemm(config: dict[str, Any], rt: Any) -> list[dict[str, Any]]:
    """Every rank at once, one size at a time, the same calls per batch on every rank: per-call
    seconds of each batch on the slowest rank (a training step waits for it)."""
    dtype = gemm_dtype(rt.device)
    out = []
    for n in config["gemm_sizes"]:
        call = gemm_call(n, dtype, rt.device)
        first = max_over(timed(call, 1, rt.device), None, rt.device)
        count = call_count(first, config.get("gemm_min_batch_s", config["min_batch_s"]),
                           config["max_calls"] * 10)
        times = []
        for _ in range(config["batches"]):
            barrier(None, rt.device)
            times.append(max_over(timed(call, count, rt.device), None, rt.device) / count)
        out.append({"n": n, "flops": 2 * n**3, "calls_per_batch": count, "times_s": times})
    return out


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    rt = init_runtime(config.get("backend", "auto"), config.get("timeout_s", 300.0))
    nodes = node_members(rt.world_size)
    gemm = measure_gemm(config, rt) if config.get("gemm_sizes") else []
    collectives = measure_collectives(config, rt, nodes) if config.get("tests") else []
    gathered: list[Any] = [None] * rt.world_size
    dist.all_gather_object(gathered, {"rank": rt.rank, "gemm": gemm, "collectives": collectives})
    if rt.rank == 0:
        device_name = (torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda"
                       else "cpu")
        write_json(out_dir / "bench.json", {
            "format": "placer-bench/1",
            "backend": rt.backend,
            "device": device_name,
            "torch": torch.__version__,
            "world_size": rt.world_size,
            "nodes": nodes,
            "gemm_dtype": str(gemm_dtype(rt.device)).removeprefix("torch."),
            "gemm": {str(g["rank"]): g["gemm"] for g in gathered},
            "collectives": [c for g in gathered for c in g["collectives"]],
        })
    barrier(None, rt.device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
