"""Proof by a real launch: the generated launch.sh on 2 emulated nodes builds the plan's groups.

One network namespace per node (placer.verify.emulate), one generated launch.sh per namespace
(static rendezvous, gloo on CPU), and a small training script that imports the generated
placer_mesh.py and all-gathers ranks over every group. The expected groups are derived here from
the plan's rank map coordinates alone (ranks that agree on every other coordinate), independently
of the code that wrote rankmap.json. Namespaces and processes are removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_launch import plan_2x2_tp_intra, plan_2x4_moe_remapped, plan_excluded_gpu

from placer.launch import write_launch_files
from placer.spec import Plan
from placer.verify.emulate import EmulatedCluster

AVAILABLE, WHY = EmulatedCluster.available()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=WHY)

CHECK_SCRIPT = """\
import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

import placer_mesh  # from the launch directory (launch.sh puts it on PYTHONPATH)


def gathered(rank, group):
    got = [None] * dist.get_world_size(group)
    dist.all_gather_object(got, rank, group=group)
    return got


pm = placer_mesh.setup(timeout_s=90)
result = {
    "rank": pm.rank,
    "coords": pm.coords,
    "env": {k: os.environ.get(k) for k in ("GROUP_RANK", "LOCAL_RANK", "WORLD_SIZE",
                                           "CUDA_VISIBLE_DEVICES", "PLACER_NODE_TYPE")},
    "netns": os.readlink("/proc/self/ns/net"),
    "backend": dist.get_backend(),
    "groups": {dim: gathered(pm.rank, pm.group(dim)) for dim in pm.dims},
    "mesh": {dim: gathered(pm.rank, pm.mesh.get_group(dim)) for dim in pm.mesh.mesh_dim_names},
}
Path(sys.argv[1], f"rank{pm.rank}.json").write_text(json.dumps(result))
pm.destroy()
"""

# Which coordinates vary inside a group of each kind; the rest must agree. Dense groups compare
# dense coordinates, expert groups the expert grid (pp, etp, ep, edp) of the same pipeline stage.
VARYING = {"tp": {"tp"}, "cp": {"cp"}, "dp": {"dp"}, "pp": {"pp"}, "dp_cp": {"dp", "cp"},
           "ep": {"ep"}, "etp": {"etp"}, "edp": {"edp"}}
DENSE = ("pp", "dp", "cp", "tp")
EXPERT = ("pp", "etp", "ep", "edp")


def expected_groups(p: Plan) -> dict[int, dict[str, list[int]]]:
    entries = p.candidates[0].rank_map
    out: dict[int, dict[str, list[int]]] = {}
    for me in entries:
        out[me.rank] = {}
        for dim, varying in VARYING.items():
            grid = EXPERT if varying & {"ep", "etp", "edp"} else DENSE
            fixed = [d for d in grid if d not in varying]
            out[me.rank][dim] = sorted(e.rank for e in entries
                                       if all(e.coords.get(d, 0) == me.coords.get(d, 0)
                                              for d in fixed))
    return out


def _namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.parametrize(
    ("make_plan", "ranks_per_node"),
    [(plan_2x2_tp_intra, [2, 2]), (plan_2x4_moe_remapped, [4, 4]), (plan_excluded_gpu, [2, 1])],
    ids=["2x2-tp-intra", "2x4-moe-remapped", "excluded-gpu-2+1"],
)
def test_generated_launch_builds_the_plan_groups_on_two_nodes(
        tmp_path: Path, make_plan: Callable[[], Plan], ranks_per_node: list[int]) -> None:
    p = make_plan()
    launch_dir, out_dir, log_dir = tmp_path / "launch", tmp_path / "out", tmp_path / "logs"
    write_launch_files(p, 0, launch_dir, script="check_groups.py")
    (launch_dir / "check_groups.py").write_text(CHECK_SCRIPT)
    out_dir.mkdir()
    log_dir.mkdir()
    with EmulatedCluster(2, None) as cluster:
        namespaces = set(cluster.node_namespaces)
        procs = []
        for node in range(2):
            env = dict(os.environ, NODE_RANK=str(node), MASTER_ADDR=cluster.node_addresses[0],
                       PLACER_BACKEND="gloo", PYTHON=sys.executable, OMP_NUM_THREADS="1",
                       GLOO_SOCKET_IFNAME=cluster.interface_name(node))
            env.pop("PLACER_RANKMAP", None)
            with open(log_dir / f"node{node}.log", "wb") as log:
                procs.append(cluster.run_in_node(
                    node, ["bash", str(launch_dir / "launch.sh"), str(out_dir)], env=env,
                    stdout=log, stderr=subprocess.STDOUT, cwd=launch_dir))
        codes = cluster.wait(procs, timeout_s=150)
        logs = "\n".join(f.read_text(errors="replace") for f in sorted(log_dir.iterdir()))
        assert codes == [0, 0], logs
    assert not namespaces & _namespaces()
    assert all(proc.poll() is not None for proc in procs)

    world = sum(ranks_per_node)
    results = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
    expected = expected_groups(p)
    plan_entries = {e.rank: e for e in p.candidates[0].rank_map}
    node_of = [n for n, count in enumerate(ranks_per_node) for _ in range(count)]
    for res in results:
        rank = res["rank"]
        assert res["backend"] == "gloo"
        assert res["env"]["GROUP_RANK"] == str(node_of[rank])
        assert res["env"]["LOCAL_RANK"] == str(plan_entries[rank].local_rank)
        assert res["env"]["WORLD_SIZE"] == str(world)
        assert res["env"]["CUDA_VISIBLE_DEVICES"] == ""
        assert {d: res["coords"][d] for d in DENSE} == {
            d: plan_entries[rank].coords.get(d, 0) for d in DENSE}
        for dim in ("tp", "pp", "dp", "cp", "ep", "dp_cp", "etp", "edp"):
            assert res["groups"][dim] == expected[rank][dim], (rank, dim)
        for dim in DENSE:  # the DeviceMesh built from the explicit mesh tensor agrees
            assert sorted(res["mesh"][dim]) == expected[rank][dim], (rank, dim)
    # Ranks of one node share a namespace; the two nodes are different namespaces.
    by_node = {n: {res["netns"] for res in results if node_of[res["rank"]] == n} for n in (0, 1)}
    assert len(by_node[0]) == len(by_node[1]) == 1 and by_node[0] != by_node[1]
