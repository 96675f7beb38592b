"""placer_mesh, the runtime a user's job copies: map validation, launch-env checks, real groups.

The torchrun test is the one that matters: a permuted layout must produce groups whose members,
proven by collectives, are exactly those of the map. The rest pin the error messages users see.
"""

from __future__ import annotations

import ast
import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers_dist import (
    PLACER_MESH_SRC,
    assert_groups_match,
    load_placer_mesh,
    make_rankmap,
    permuted_4rank_map,
    prepare_job,
    read_results,
    run_standalone,
)

pm_mod = load_placer_mesh()


def test_template_imports_only_stdlib_and_torch() -> None:
    tree = ast.parse(PLACER_MESH_SRC.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    assert "placer" not in roots
    third_party = {r for r in roots if r not in sys.stdlib_module_names}
    assert third_party == {"torch"}


def test_torchrun_permuted_mesh_groups_proven_by_collectives(tmp_path: Path) -> None:
    rankmap = permuted_4rank_map([4])
    assert rankmap["groups"]["tp"] == [[0, 3], [1, 2]]
    script, out_dir = prepare_job(tmp_path, rankmap)
    run_standalone(script, 4, [str(out_dir)], timeout_s=180)
    results = read_results(out_dir, 4)
    assert_groups_match(rankmap, results)
    # Independent of the helper: rank 0's tp partner is 3, rank 1's is 2 (not the default 1/0).
    assert results[0]["gathered"]["tp"] == [0, 3]
    assert results[1]["gathered"]["tp"] == [1, 2]
    assert results[2]["gathered"]["ep"] == [0, 2]
    assert results[3]["gathered"]["cp"] == [3]


def _env(rank: int, local: int, world: int = 4, group: int | None = None) -> dict[str, str]:
    env = {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world)}
    if group is not None:
        env["GROUP_RANK"] = str(group)
    return env


def test_check_launch_env_accepts_matching_env() -> None:
    rankmap = permuted_4rank_map([2, 2])
    entry = pm_mod.check_launch_env(rankmap, _env(3, 1, group=1))
    assert entry["rank"] == 3 and entry["node"] == 1 and entry["coords"] == {"dp": 0, "tp": 1}


@pytest.mark.parametrize(
    ("env", "fragments"),
    [
        (
            _env(1, 0),
            ["launcher gave RANK=1 LOCAL_RANK=0 WORLD_SIZE=4", "expects rank 1 on node 0",
             "local_rank 1"],
        ),
        (
            _env(2, 0, group=0),
            ["GROUP_RANK=0", "expects rank 2 on node 1", "--node-rank"],
        ),
        (_env(0, 0, world=8), ["WORLD_SIZE=8", "expects world_size 4"]),
        ({"LOCAL_RANK": "0", "WORLD_SIZE": "4"}, ["RANK is not set", "torchrun"]),
        ({"RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}, ["RANK='x' is not an integer"]),
    ],
)  # fmt: skip
def test_check_launch_env_mismatch_is_explained(env: dict[str, str], fragments: list[str]) -> None:
    rankmap = permuted_4rank_map([2, 2])
    with pytest.raises(pm_mod.PlacerMeshError) as info:
        pm_mod.check_launch_env(rankmap, env, source="rankmap.json")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_setup_rejects_mismatching_env_before_any_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    path = tmp_path / "rankmap.json"
    path.write_text(json.dumps(permuted_4rank_map([2, 2])))
    monkeypatch.setenv("PLACER_RANKMAP", str(path))
    for key, value in _env(1, 0, group=0).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(pm_mod.PlacerMeshError, match="expects rank 1 on node 0 as local_rank 1"):
        pm_mod.setup()
    assert not dist.is_initialized()


def test_load_rankmap_default_path_and_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "map.json"
    path.write_text(json.dumps(permuted_4rank_map([4])))
    monkeypatch.setenv("PLACER_RANKMAP", str(path))
    assert pm_mod.load_rankmap()["world_size"] == 4
    monkeypatch.setenv("PLACER_RANKMAP", str(tmp_path / "absent.json"))
    with pytest.raises(pm_mod.PlacerMeshError, match="cannot read the rank map .*PLACER_RANKMAP"):
        pm_mod.load_rankmap()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(pm_mod.PlacerMeshError, match="not valid JSON"):
        pm_mod.load_rankmap(bad)


def test_validate_accepts_the_documented_8_rank_example() -> None:
    mesh = [[[[0, 1]], [[2, 3]]], [[[4, 5]], [[6, 7]]]]
    rankmap = make_rankmap(
        ["pp", "dp", "cp", "tp"],
        mesh,
        [4, 4],
        extra_groups={"ep": [[0, 2], [1, 3], [4, 6], [5, 7]], "dp_cp": [[0, 2], [1, 3], [4, 6],
                                                                          [5, 7]]},
    )  # fmt: skip
    assert rankmap["mesh_shape"] == [2, 2, 1, 2]
    assert rankmap["groups"]["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert rankmap["groups"]["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert pm_mod.validate_rankmap(rankmap) is rankmap


def _broken(mutate: Any) -> dict[str, Any]:
    rankmap = copy.deepcopy(permuted_4rank_map([2, 2]))
    mutate(rankmap)
    return rankmap


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m.update(format="placer-rankmap/0"), "format is 'placer-rankmap/0'"),
        (lambda m: m.pop("groups"), "required field 'groups' is missing"),
        (lambda m: m.update(mesh_shape=[4, 2]), "holds 8 ranks, world_size is 4"),
        (lambda m: m.update(mesh=[[0, 3], [1, 1]]), "each rank 0..3 exactly once"),
        (lambda m: m.update(mesh=[[0, 3, 1], [2]]), "mesh_shape says 2"),
        (lambda m: m["groups"].update(tp=[[0, 1], [2, 3]]), "disagrees with the mesh"),
        (lambda m: m["groups"].update(ep=[[0, 2], [2, 3]]), "rank 2 is in two 'ep' groups"),
        (lambda m: m["groups"].update(ep=[[2, 0], [1, 3]]), "must be sorted"),
        (lambda m: m["ranks"][1].update(local_rank=0), "both use node 0 local_rank 0"),
        (lambda m: m["ranks"][1].update(gpu=5), "local_rank 1 runs on device 1"),
        (lambda m: m["ranks"][3]["coords"].update(dp=1), "mesh puts rank 3 at dp=0"),
        (lambda m: m["ranks"][0]["groups"].update(ep=1), "rank 0 is in groups['ep'][0]"),
        (
            lambda m: m["nodes"][1].update(num_ranks=3, cuda_visible_devices="0,1,2"),
            "nodes hold 5 ranks",
        ),
    ],
)
def test_validate_rejects_inconsistent_maps(mutate: Any, message: str) -> None:
    with pytest.raises(pm_mod.PlacerMeshError) as info:
        pm_mod.validate_rankmap(_broken(mutate), source="rankmap.json")
    assert str(info.value).startswith("rankmap.json: ")
    assert message in str(info.value)
