"""rankmap.json: torchrun's numbering, the explicit mesh, the groups, and the plan checks.

Expected groups are written out by hand from the layout (not recomputed with placer's code), and
every generated document must pass placer_mesh's own validator, which the job runs at start-up.
"""

from __future__ import annotations

import json

import pytest
from helpers_dist import load_placer_mesh
from helpers_launch import (
    JOB,
    candidate,
    plan,
    plan_2x2_tp_intra,
    plan_2x4_moe_remapped,
    plan_excluded_gpu,
    rank_map,
    small_cluster,
)

from placer.errors import PlacerError
from placer.launch import launch_files, placement_of, rankmap_document
from placer.spec import Layout, RankEntry
from placer.spec.presets import model_preset

pm_mod = load_placer_mesh()


def test_natural_2x2_map_and_groups() -> None:
    doc = rankmap_document(placement_of(plan_2x2_tp_intra()))
    assert doc["format"] == "placer-rankmap/1"
    assert doc["world_size"] == 4
    assert doc["mesh_dim_names"] == ["pp", "dp", "cp", "tp"]
    assert doc["mesh_shape"] == [1, 2, 1, 2]
    assert doc["mesh"] == [[[[0, 1]], [[2, 3]]]]
    assert doc["groups"]["tp"] == [[0, 1], [2, 3]]
    assert doc["groups"]["dp"] == [[0, 2], [1, 3]]
    assert doc["groups"]["dp_cp"] == [[0, 2], [1, 3]]
    assert doc["groups"]["pp"] == [[0], [1], [2], [3]]
    assert [n["num_ranks"] for n in doc["nodes"]] == [2, 2]
    assert [n["cuda_visible_devices"] for n in doc["nodes"]] == ["0,1", "0,1"]
    entry = doc["ranks"][3]
    assert (entry["node"], entry["local_rank"], entry["gpu"]) == (1, 1, 1)
    assert entry["coords"] == {"pp": 0, "dp": 1, "cp": 0, "tp": 1, "ep": 0, "etp": 0, "edp": 3}
    assert entry["groups"]["tp"] == 1 and entry["groups"]["dp"] == 1
    assert pm_mod.validate_rankmap(doc) is doc


def test_remapped_moe_map_puts_cp_across_nodes() -> None:
    # Rank r holds grid point [0,1,4,5,2,3,6,7][r] of tp(stride 1) x cp(2) x dp(4).
    doc = rankmap_document(placement_of(plan_2x4_moe_remapped()))
    assert doc["mesh"] == [[[[0, 1], [4, 5]], [[2, 3], [6, 7]]]]
    assert doc["groups"]["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert doc["groups"]["cp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert doc["groups"]["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert doc["groups"]["dp_cp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # ep=2, etp=1: experts spread over the innermost (tp) points; the rest is expert DP.
    assert doc["groups"]["ep"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert doc["groups"]["edp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert doc["ranks"][4]["coords"]["cp"] == 1 and doc["ranks"][4]["node"] == 1
    assert pm_mod.validate_rankmap(doc) is doc


def test_excluded_gpu_gives_uneven_nodes_and_visible_devices() -> None:
    doc = rankmap_document(placement_of(plan_excluded_gpu()))
    assert [(n["num_ranks"], n["cuda_visible_devices"]) for n in doc["nodes"]] == [
        (2, "0,1"), (1, "1")]
    last = doc["ranks"][2]
    assert (last["node"], last["local_rank"], last["gpu"]) == (1, 0, 1)
    assert doc["groups"]["dp"] == [[0, 1, 2]]
    assert pm_mod.validate_rankmap(doc) is doc


def test_unused_cluster_node_is_skipped_in_launch_numbering() -> None:
    model, cluster = model_preset("llama3-8b"), small_cluster(3, 2)
    layout = Layout(tp=2, dp=2, zero_stage=1)
    entries = rank_map(cluster, layout, ("tp", "cp", "dp", "pp"),
                       gpus_of_node={1: [0, 1], 2: [0, 1]})
    p = plan(model, cluster, [candidate(model, cluster, JOB, layout, entries=entries)])
    doc = rankmap_document(placement_of(p))
    assert [(n["index"], n["cluster_node"]) for n in doc["nodes"]] == [(0, 1), (1, 2)]
    assert [r["node"] for r in doc["ranks"]] == [0, 0, 1, 1]
    assert pm_mod.validate_rankmap(doc) is doc


def _with_rank_map(entries: list[RankEntry]):  # type: ignore[no-untyped-def]
    p = plan_2x2_tp_intra()
    bad = p.candidates[0].model_copy(update={"rank_map": entries})
    return p.model_copy(update={"candidates": [bad]})


def _entries() -> list[RankEntry]:
    return [e.model_copy() for e in plan_2x2_tp_intra().candidates[0].rank_map]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda es: es[:3], "has 3 entries, but the layout"),
        (lambda es: [*es[:3], es[3].model_copy(update={"gpu": 0})], "is used by two ranks"),
        (lambda es: [*es[:3], es[3].model_copy(update={"gpu": 7})], "healthy GPUs [0, 1]"),
        (lambda es: [*es[:3], es[3].model_copy(update={"node": 5})], "nodes 0..1"),
        (lambda es: [*es[:3], es[3].model_copy(update={"coords": {"tp": 0, "dp": 1}})],
         "has the same coordinates"),
        (lambda es: [*es[:3], es[3].model_copy(update={"coords": {"tp": 2, "dp": 1}})],
         "coords.tp: 2 is not valid; must be in 0..1"),
        (lambda es: [*es[:3], es[3].model_copy(update={"coords": {"tp": 1, "dp": 1, "ep": 1}})],
         "the grid puts this point at ep=0"),
        (lambda es: [es[1].model_copy(update={"rank": 0, "local_rank": 0}),
                     es[0].model_copy(update={"rank": 1, "local_rank": 1}), *es[2:]],
         "torchrun's static rendezvous gives it rank 1 local_rank 1"),
    ],
)  # fmt: skip
def test_inconsistent_rank_maps_are_rejected(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PlacerError) as info:
        placement_of(_with_rank_map(mutate(_entries())))
    assert message in str(info.value)


def test_candidate_index_and_layout_rules_are_checked() -> None:
    p = plan_2x2_tp_intra()
    with pytest.raises(PlacerError, match=r"--candidate: 1 is not valid; the plan has candidates"):
        placement_of(p, 1)
    bad_layout = p.candidates[0].layout.model_copy(update={"tp": 3, "dp": 1})
    broken = p.model_copy(update={"candidates": [p.candidates[0].model_copy(
        update={"layout": bad_layout})]})
    with pytest.raises(PlacerError, match="layout"):
        placement_of(broken)


def test_rankmap_json_is_deterministic() -> None:
    first = [f.text for f in launch_files(plan_2x4_moe_remapped())]
    second = [f.text for f in launch_files(plan_2x4_moe_remapped())]
    assert first == second
    doc = json.loads(next(f.text for f in launch_files(plan_2x4_moe_remapped())
                          if f.name == "rankmap.json"))
    assert doc["layout"] == "tp=2,pp=1,dp=2,cp=2,ep=2,etp=1,vpp=1,mbs=1,zero=1,recompute=none,sp=on"
    assert doc["mesh_order"] == "tp-cp-dp-pp"
