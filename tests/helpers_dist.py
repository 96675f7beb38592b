"""Shared helpers for tests that run placer_mesh under torchrun (standalone or emulated nodes).

Kept out of conftest so the tests import exactly what they use; the worker script is written to a
temp dir next to a copy of placer_mesh.py, the way a user's job would use it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
PLACER_MESH_SRC = REPO_ROOT / "placer" / "launch" / "templates" / "placer_mesh.py"

# Runs on every rank: builds the groups from the map, then proves each group's membership with
# real collectives and writes what it saw to <out_dir>/rank<r>.json for the test to assert.
CHECK_SCRIPT = """\
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import torch.distributed as dist

import placer_mesh


def gather_ranks(rank, group):
    got = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, rank, group=group)
    return got


def main():
    out_dir = Path(sys.argv[1])
    pm = placer_mesh.setup(Path(__file__).resolve().with_name("rankmap.json"), timeout_s=90)
    result = {
        "rank": pm.rank,
        "node": pm.node,
        "local_rank": pm.local_rank,
        "coords": pm.coords,
        "env": {k: os.environ.get(k) for k in (
            "RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "PLACER_NODE_INDEX",
            "GLOO_SOCKET_IFNAME", "MASTER_ADDR")},
        "netns": os.readlink("/proc/self/ns/net"),
        "mesh_coordinate": pm.mesh.get_coordinate(),
        "dims": pm.dims,
        "device": str(pm.device),
        "backend": dist.get_backend(),
        "group_ranks": {},
        "gathered": {},
        "sums": {},
        "mesh_gathered": {},
    }
    for dim in pm.dims:
        group = pm.group(dim)
        result["group_ranks"][dim] = pm.group_ranks(dim)
        result["gathered"][dim] = gather_ranks(pm.rank, group)
        value = torch.tensor([float(pm.rank)], device=pm.device)
        dist.all_reduce(value, group=group)
        result["sums"][dim] = value.item()
    for dim in pm.mesh.mesh_dim_names:
        result["mesh_gathered"][dim] = gather_ranks(pm.rank, pm.mesh.get_group(dim))
    (out_dir / f"rank{pm.rank}.json").write_text(json.dumps(result))
    pm.destroy()


if __name__ == "__main__":
    main()
"""


def load_placer_mesh() -> ModuleType:
    """Import the template module from its file, as a user's copy would be imported."""
    spec = importlib.util.spec_from_file_location("placer_mesh_under_test", PLACER_MESH_SRC)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mesh_positions(mesh: Any, depth: int) -> dict[tuple[int, ...], int]:
    if depth == 0:
        return {(): int(mesh)}
    out: dict[tuple[int, ...], int] = {}
    for k, child in enumerate(mesh):
        for coord, rank in _mesh_positions(child, depth - 1).items():
            out[(k, *coord)] = rank
    return out


def make_rankmap(
    mesh_dim_names: list[str],
    mesh: list[Any],
    ranks_per_node: list[int],
    extra_groups: dict[str, list[list[int]]] | None = None,
) -> dict[str, Any]:
    """A placer-rankmap/1 document for ``mesh``, with torchrun's node-by-node rank numbering.

    Groups of the mesh dims are derived from the mesh; ``extra_groups`` adds dims such as ep.
    """
    positions = _mesh_positions(mesh, len(mesh_dim_names))
    shape = [max(c[a] for c in positions) + 1 for a in range(len(mesh_dim_names))]
    world = len(positions)
    assert sum(ranks_per_node) == world
    groups: dict[str, list[list[int]]] = {}
    for axis, dim in enumerate(mesh_dim_names):
        buckets: dict[tuple[int, ...], list[int]] = {}
        for coord, rank in positions.items():
            buckets.setdefault(coord[:axis] + coord[axis + 1 :], []).append(rank)
        groups[dim] = sorted(sorted(b) for b in buckets.values())
    groups.update({k: sorted(sorted(g) for g in v) for k, v in (extra_groups or {}).items()})
    coord_of = {rank: coord for coord, rank in positions.items()}
    nodes, ranks = [], []
    base = 0
    for index, count in enumerate(ranks_per_node):
        nodes.append(
            {
                "index": index,
                "num_ranks": count,
                "cuda_visible_devices": ",".join(str(g) for g in range(count)),
            }
        )
        for local in range(count):
            rank = base + local
            ranks.append(
                {
                    "rank": rank,
                    "node": index,
                    "local_rank": local,
                    "gpu": local,
                    "coords": dict(zip(mesh_dim_names, coord_of[rank], strict=True)),
                    "groups": {
                        dim: next(i for i, g in enumerate(gs) if rank in g)
                        for dim, gs in groups.items()
                    },
                }
            )
        base += count
    return {
        "format": "placer-rankmap/1",
        "world_size": world,
        "backend_hint": "gloo",
        "mesh_dim_names": list(mesh_dim_names),
        "mesh_shape": shape,
        "mesh": mesh,
        "nodes": nodes,
        "ranks": ranks,
        "groups": groups,
    }


def permuted_4rank_map(ranks_per_node: list[int]) -> dict[str, Any]:
    """dp x tp = 2 x 2 with a non-trivial layout: tp groups {0,3},{1,2}; dp {0,1},{2,3}.

    Plus ep {0,2},{1,3} (not a mesh dim), dp_cp = dp, and size-1 cp groups.
    """
    return make_rankmap(
        ["dp", "tp"],
        [[0, 3], [1, 2]],
        ranks_per_node,
        extra_groups={
            "ep": [[0, 2], [1, 3]],
            "dp_cp": [[0, 1], [2, 3]],
            "cp": [[0], [1], [2], [3]],
        },
    )


def prepare_job(job_dir: Path, rankmap: dict[str, Any]) -> tuple[Path, Path]:
    """Write rankmap.json, a copy of placer_mesh.py and the check script; return (script, out)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(PLACER_MESH_SRC, job_dir / "placer_mesh.py")
    (job_dir / "rankmap.json").write_text(json.dumps(rankmap, indent=1))
    script = job_dir / "check_mesh.py"
    script.write_text(CHECK_SCRIPT)
    out_dir = job_dir / "out"
    out_dir.mkdir(exist_ok=True)
    return script, out_dir


def run_standalone(script: Path, nproc: int, args: list[str], timeout_s: float) -> None:
    """Single-machine torchrun; fails the test with the job's output if it does not exit 0."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PLACER_RANKMAP", None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(nproc), "--max-restarts", "0", str(script), *args],
        capture_output=True, text=True, timeout=timeout_s, env=env, cwd=script.parent,
        check=False,
    )  # fmt: skip
    output = f"{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{output}"


def read_results(out_dir: Path, world: int) -> list[dict[str, Any]]:
    files = sorted(out_dir.glob("rank*.json"))
    assert len(files) == world, f"expected {world} result files, found {[f.name for f in files]}"
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def assert_groups_match(rankmap: dict[str, Any], results: list[dict[str, Any]]) -> None:
    """Every rank's collectives reached exactly the ranks its map group lists, in group order."""
    names = rankmap["mesh_dim_names"]
    for res in results:
        rank = res["rank"]
        entry = rankmap["ranks"][rank]
        assert res["node"] == entry["node"] and res["local_rank"] == entry["local_rank"]
        assert res["coords"] == entry["coords"]
        assert res["mesh_coordinate"] == [entry["coords"][d] for d in names]
        assert res["dims"] == sorted(rankmap["groups"])
        for dim, groups in rankmap["groups"].items():
            expected = groups[entry["groups"][dim]]
            assert rank in expected
            assert res["group_ranks"][dim] == expected, (rank, dim)
            assert res["gathered"][dim] == expected, (rank, dim)
            assert res["sums"][dim] == float(sum(expected)), (rank, dim)
        for dim in names:
            expected = rankmap["groups"][dim][entry["groups"][dim]]
            assert sorted(res["mesh_gathered"][dim]) == expected, (rank, dim)


__all__ = [
    "CHECK_SCRIPT",
    "PLACER_MESH_SRC",
    "assert_groups_match",
    "load_placer_mesh",
    "make_rankmap",
    "permuted_4rank_map",
    "prepare_job",
    "read_results",
    "run_standalone",
]


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is still a live process (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
