"""Replay one training step of a candidate, on every rank under torchrun.

Usage: ``replay.py CONFIG.json OUT_DIR`` where CONFIG names the job directory holding the
candidate's launch files (``rankmap.json`` and ``placer_mesh.py``, as ``placer launch`` writes
them) and the program of every pipeline stage (placer/verify/replay.py builds it). The groups
come from the rank map through placer_mesh, exactly as a training job would build them, so a
successful replay is also a dry run of the launch files.

Each rank writes ``OUT_DIR/rank<r>.json``: per timed step its own time and the slowest rank's
(a barrier starts every step), the duration of each communication op in execution order, and
the time spent in the GEMM stand-in.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from placer.verify.workers.common import (
    barrier,
    gemm_call,
    gemm_dtype,
    make_collective,
    max_over,
    mesh_from_config,
    synchronize,
    write_json,
)
from placer.verify.workers.sizes import elements_for


def neighbour(pm: Any, dim: str, offset: int) -> int | None:
    """Global rank with this rank's coordinates except ``dim`` shifted by ``offset``."""
    want = dict(pm.coords)
    want[dim] = want[dim] + offset
    for entry in pm.rankmap["ranks"]:
        coords = entry["coords"]
        if all(coords.get(k) == v for k, v in want.items()):
            return int(entry["rank"])
    return None


def ring_neighbours(pm: Any, dim: str) -> tuple[int, int]:
    """(next, previous) rank in this rank's ``dim`` group, ordered by the ``dim`` coordinate."""
    size = len(pm.group_ranks(dim))
    me = pm.coords[dim]
    after = neighbour(pm, dim, (me + 1) % size - me)
    before = neighbour(pm, dim, (me - 1) % size - me)
    assert after is not None and before is not None
    return after, before


class Runner:
    """Callables for every op kind of the program, buffers allocated once."""

    def __init__(self, pm: Any, kinds: list[dict[str, Any]], gemm_n: int) -> None:
        self.pm = pm
        self.device = pm.device
        self.pending: list[Any] = []
        self.calls: dict[int, Callable[[], None]] = {}
        self.p2p: dict[int, torch.Tensor] = {}
        for kind in kinds:
            if kind["dimension"] == "pp":
                n = elements_for(kind["bytes"], 1)
                self.p2p[kind["id"]] = torch.ones(n, dtype=torch.float32, device=self.device)
            elif kind["dimension"] == "cp":
                self.calls[kind["id"]] = self._exchange(kind["bytes"])
            else:
                group = kind["group"]
                call, _ = make_collective(kind["collective"], kind["bytes"], pm.group(group),
                                          pm.group_ranks(group), pm.rank, self.device)
                self.calls[kind["id"]] = call
        self.gemm = gemm_call(gemm_n, gemm_dtype(self.device), self.device)
        self.next_stage = neighbour(pm, "pp", 1)
        self.prev_stage = neighbour(pm, "pp", -1)

    def _exchange(self, nbytes: int) -> Callable[[], None]:
        """CP ring step: send this rank's K/V chunk on, receive the previous rank's."""
        after, before = ring_neighbours(self.pm, "cp")
        n = elements_for(nbytes, 1)
        out = torch.ones(n, dtype=torch.float32, device=self.device)
        into = torch.empty(n, dtype=torch.float32, device=self.device)

        def run() -> None:
            works = [dist.isend(out, dst=after), dist.irecv(into, src=before)]
            for work in works:
                work.wait()

        return run

    def run(self, name: str, arg: int) -> None:
        if name == "g":
            for _ in range(arg):
                self.gemm()
        elif name == "c" or name == "x":
            self.calls[arg]()
        elif name in ("s", "S"):
            dst = self.next_stage if name == "s" else self.prev_stage
            self.pending.append(dist.isend(self.p2p[arg], dst=dst))
        else:  # "r" / "R": blocking receive from the previous / next stage
            src = self.prev_stage if name == "r" else self.next_stage
            dist.recv(self.p2p[arg], src=src)

    def drain(self) -> None:
        for work in self.pending:
            work.wait()
        self.pending.clear()


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    pm = mesh_from_config(config)
    stage = int(pm.coords.get("pp", 0))
    ops = [(str(name), int(arg)) for name, arg in config["stages"][stage]]
    runner = Runner(pm, config["kinds"], config["gemm_n"])
    warmup, steps = config["warmup_steps"], config["steps"]
    record: dict[str, Any] = {"rank": pm.rank, "stage": stage, "node": pm.node,
                              "step_local_s": [], "step_max_s": [], "gemm_s": [],
                              "ops": {str(k["id"]): [] for k in config["kinds"]}}
    for step in range(warmup + steps):
        durations: dict[int, list[float]] = {k["id"]: [] for k in config["kinds"]}
        gemm_s = 0.0
        barrier(None, pm.device)
        start = time.perf_counter()
        for name, arg in ops:
            began = time.perf_counter()
            runner.run(name, arg)
            synchronize(pm.device)
            spent = time.perf_counter() - began
            if name == "g":
                gemm_s += spent
            elif name not in ("s", "S"):
                durations[arg].append(spent)
        runner.drain()
        synchronize(pm.device)
        local = time.perf_counter() - start
        slowest = max_over(local, None, pm.device)
        if step >= warmup:
            record["step_local_s"].append(local)
            record["step_max_s"].append(slowest)
            record["gemm_s"].append(gemm_s)
            for kind, values in durations.items():
                record["ops"][str(kind)].append(values)
    record["gemm_calls"] = sum(arg for name, arg in ops if name == "g")
    write_json(out_dir / f"rank{pm.rank}.json", record)
    pm.destroy()


if __name__ == "__main__":
    main()
