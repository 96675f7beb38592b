"""Random (model, cluster, job) triples never crash, and every plan keeps its promises.

Each triple ends in a plan or in a one-line infeasibility reason (``strategies.run_case``): the
solver, the plan and its human rendering, then the invariants every plan must keep: it passes
``placer check``, fits its memory estimates, maps ranks one to one onto healthy GPUs with groups
of exactly the layout's degrees, and renders its launch files. The CI share is a few hundred
derandomized examples kept small (at most 16 nodes); bench/fuzz.py runs 10,000 of every size.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import (
    InvariantError,
    check_invariants,
    describe,
    edge_tags,
    profiles,
    run_case,
    triples,
)

from placer.report.plan import make_plan
from placer.spec import Cluster, Job, Model
from placer.spec.presets import cluster_preset, model_preset
from placer.spec.profile import LinkProfile

CI = settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))


def _assert_not_a_crash(model: Model, cluster: Cluster, job: Job, **options: Any) -> str:
    outcome = run_case(model, cluster, job, **options)
    assert outcome.kind != "crash", f"{outcome.detail}\n{describe(model, cluster, job)}"
    return outcome.kind


def test_random_triples_end_in_a_plan_or_a_one_line_reason() -> None:
    kinds: Counter[str] = Counter()

    @CI
    @given(triples(huge=False, max_nodes=16), st.none() | profiles())
    def check(triple: tuple[Model, Cluster, Job], profile: LinkProfile | None) -> None:
        kinds[_assert_not_a_crash(*triple, profile=profile)] += 1

    check()
    total = sum(kinds.values())
    assert kinds["plan"] >= total // 4 and kinds["infeasible"] >= total // 10, kinds


def _model(**fields: Any) -> Model:
    base = {"name": "edge", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
            "ffn_hidden_size": 4096, "vocab_size": 32000}
    return Model.model_validate({**base, **fields})


def _cluster(gpus_per_node: int, nodes: int, **extra: Any) -> Cluster:
    base = cluster_preset("dgx-h100").model_dump()
    node_type = {**base["node_types"][0], "gpus_per_node": gpus_per_node,
                 "fabric": {**base["node_types"][0]["fabric"], "nvlink_domain_size": gpus_per_node,
                            "pcie_switch_groups": [], "numa_groups": []},
                 "nics": [{"name": f"mlx5_{i}", "rate_gbps": 400, "gpus": [i]}
                          for i in range(gpus_per_node)]}
    return Cluster.model_validate({**base, "node_types": [node_type],
                                   "pools": [{"node_type": node_type["name"], "count": nodes}],
                                   **extra})


JOB = Job(seq_len=4096, global_batch_size=64)
EDGE_CASES: dict[str, tuple[Model, Cluster, Job]] = {
    "1 GPU": (_model(), _cluster(1, 1), JOB),
    "7 GPUs in one node": (_model(), _cluster(7, 1), JOB),
    "13 one-GPU nodes": (_model(num_attention_heads=13, hidden_size=13 * 64), _cluster(1, 13),
                         Job(seq_len=4096, global_batch_size=13)),
    "1 layer": (_model(num_layers=1), _cluster(8, 2), JOB),
    "12 heads, 3 KV heads": (_model(num_attention_heads=12, num_kv_heads=3, hidden_size=768),
                             _cluster(8, 1), JOB),
    "256k vocabulary": (_model(vocab_size=262_144), _cluster(8, 1), JOB),
    "MoE with 1 expert": (_model(moe={"num_experts": 1, "top_k": 1,
                                      "expert_ffn_hidden_size": 4096}), _cluster(8, 1), JOB),
    "1M-token sequence": (model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(16),
                          Job(seq_len=2**20, global_batch_size=1)),
    "irregular: failed GPUs": (model_preset("llama3-8b"),
                               _cluster(8, 3, excluded_gpus=[{"node": 1, "gpu": 3}]), JOB),
    "irregular: mixed A100 and H100": (
        model_preset("llama3-8b"),
        Cluster.model_validate({
            "name": "mixed",
            "node_types": [cluster_preset("dgx-a100").node_types[0].model_dump(),
                           cluster_preset("dgx-h100").node_types[0].model_dump()],
            "pools": [{"node_type": "dgx-a100", "count": 1},
                      {"node_type": "dgx-h100", "count": 2}]}), JOB),
}


@pytest.mark.parametrize("name", sorted(EDGE_CASES))
def test_edge_cases_do_not_crash(name: str) -> None:
    model, cluster, job = EDGE_CASES[name]
    assert edge_tags(model, cluster, job), "the case exercises no listed edge"
    _assert_not_a_crash(model, cluster, job)


def test_a_100000_gpu_cluster_gets_a_plan_that_keeps_its_promises() -> None:
    """The largest cluster the issue names, every GPU used: the plan, its launch files and
    placer check over 100,000 ranks."""
    cluster = cluster_preset("dgx-h100").with_nodes(12_500)
    assert cluster.num_gpus == 100_000
    job = Job(seq_len=8192, global_batch_size=25_000)
    assert _assert_not_a_crash(model_preset("llama3-70b"), cluster, job, top_k=1) == "plan"


def test_what_ifs_and_explanation_do_not_crash_at_the_edges() -> None:
    """make_plan's what-if searches (twice and half the batch, twice the nodes) on edge jobs:
    a batch at the top of its range cannot be doubled."""
    for model, cluster, job in (
            (_model(), _cluster(8, 1), Job(seq_len=128, global_batch_size=100_000_000)),
            (_model(num_layers=1), _cluster(1, 1), Job(seq_len=1, global_batch_size=1)),
            (model_preset("llama3-8b"), _cluster(8, 2), JOB)):
        _assert_not_a_crash(model, cluster, job, with_what_ifs=True)


# ----- the oracle itself can fail ---------------------------------------------------------------


@pytest.fixture(scope="module")
def good_plan() -> Any:
    model = model_preset("llama3-70b")
    cluster = cluster_preset("dgx-h100").with_nodes(4)
    plan = make_plan(model, cluster, JOB, top_k=2, with_what_ifs=False).plan
    check_invariants(plan)
    return plan


def _with_candidate(plan: Any, **changes: Any) -> Any:
    candidate = plan.candidates[0].model_copy(update=changes)
    return plan.model_copy(update={"candidates": [candidate, *plan.candidates[1:]]})


def _entries(plan: Any) -> list[Any]:
    return [e.model_copy() for e in plan.candidates[0].rank_map]


def test_oracle_rejects_two_ranks_on_one_gpu(good_plan: Any) -> None:
    entries = _entries(good_plan)
    entries[1] = entries[1].model_copy(update={"node": entries[0].node, "gpu": entries[0].gpu})
    with pytest.raises(InvariantError, match="share a GPU"):
        check_invariants(_with_candidate(good_plan, rank_map=entries))


def test_oracle_rejects_a_rank_on_a_failed_gpu(good_plan: Any) -> None:
    cluster = good_plan.cluster.model_copy(update={"excluded_gpus": []})
    failed = Cluster.model_validate({**cluster.model_dump(), "excluded_gpus": [
        {"node": good_plan.candidates[0].rank_map[0].node,
         "gpu": good_plan.candidates[0].rank_map[0].gpu}]})
    with pytest.raises(InvariantError, match="not a healthy GPU"):
        check_invariants(good_plan.model_copy(update={"cluster": failed}))


def test_oracle_rejects_groups_that_do_not_match_the_degrees(good_plan: Any) -> None:
    entries = _entries(good_plan)
    first, last = entries[0], entries[-1]
    entries[0] = first.model_copy(update={"coords": dict(last.coords)})
    with pytest.raises(InvariantError, match="coordinates|groups"):
        check_invariants(_with_candidate(good_plan, rank_map=entries))


def test_oracle_rejects_a_layout_over_memory(good_plan: Any) -> None:
    memory = good_plan.candidates[0].memory
    over = memory.model_copy(update={"total_bytes": memory.capacity_bytes + 1})
    with pytest.raises(InvariantError, match="memory"):
        check_invariants(_with_candidate(good_plan, memory=over))


def test_oracle_rejects_what_placer_check_rejects(good_plan: Any) -> None:
    """Swap grid points between the nodes so TP groups span both: still a bijection with full
    groups, but placer check's tp-cross-node error."""
    entries = _entries(good_plan)
    tp = good_plan.candidates[0].layout.tp
    assert tp > 1, "the fixture needs a layout with TP"
    half = len(entries) // 2
    for i in range(1, half, tp):
        a, b = entries[i], entries[i + half]
        entries[i] = a.model_copy(update={"coords": dict(b.coords)})
        entries[i + half] = b.model_copy(update={"coords": dict(a.coords)})
    with pytest.raises(InvariantError, match="placer check rejects"):
        check_invariants(_with_candidate(good_plan, rank_map=entries))


def test_same_input_same_plan_in_process() -> None:
    model, cluster, job = EDGE_CASES["irregular: failed GPUs"]
    first = run_case(model, cluster, job)
    second = run_case(model, cluster, job)
    assert first.kind == "plan" and first.plan_text == second.plan_text


# Every positive hardware figure, pushed to the smallest and largest floats: refused as input, or
# planned without a crash (a tiny bandwidth must not turn into an infinite step time).
_HARDWARE_FIELDS = (
    ("node_types", 0, "gpu", "bf16_flops"), ("node_types", 0, "gpu", "fp8_flops"),
    ("node_types", 0, "gpu", "hbm_bandwidth_bytes_per_s"),
    ("node_types", 0, "gpu", "usable_memory_bytes"), ("node_types", 0, "gpu", "memory_bytes"),
    ("node_types", 0, "fabric", "nvlink_bandwidth_bytes_per_s"),
    ("node_types", 0, "fabric", "pcie_bandwidth_bytes_per_s"),
    ("node_types", 0, "nics", 0, "rate_gbps"), ("latency", "network_s"),
    ("latency", "nvlink_s"), ("network", "oversubscription"),
)


@pytest.mark.parametrize("value", [5e-324, 1e-300, 1e-9, 1e300])
@pytest.mark.parametrize("field", _HARDWARE_FIELDS, ids=lambda f: ".".join(map(str, f[2:])))
def test_extreme_hardware_figures_are_refused_or_planned(field: tuple[Any, ...],
                                                         value: float) -> None:
    from placer.errors import PlacerError
    from placer.spec.presets import validated

    data = cluster_preset("dgx-h100").with_nodes(2).model_dump()
    node = data
    for key in field[:-1]:
        node = node[key]
    node[field[-1]] = value
    try:
        cluster = validated(Cluster, data, "cluster.yaml")
    except PlacerError as exc:
        assert "\n" not in str(exc)
        return
    _assert_not_a_crash(model_preset("llama3-8b"), cluster, JOB)


@pytest.mark.parametrize("value", [5e-324, 1e-300, 1e-9])
@pytest.mark.parametrize("field", [("intra_node", "bandwidth_bytes_per_s"),
                                   ("inter_node", "bandwidth_bytes_per_s"),
                                   ("gemm", "max_efficiency"), ("gemm", "attention_efficiency")])
def test_extreme_link_profiles_are_refused_or_planned(field: tuple[str, str],
                                                      value: float) -> None:
    from placer.errors import PlacerError
    from placer.spec.presets import validated
    from placer.spec.profile import LinkProfile

    data: dict[str, Any] = {"intra_node": {"latency_s": 5e-6, "bandwidth_bytes_per_s": 3e11},
                            "inter_node": {"latency_s": 1e-5, "bandwidth_bytes_per_s": 4e10},
                            "gemm": {"max_efficiency": 0.6}}
    data[field[0]][field[1]] = value
    try:
        profile = validated(LinkProfile, data, "profile.yaml")
    except PlacerError as exc:
        assert "\n" not in str(exc)
        return
    try:
        rec = make_plan(model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(2), JOB,
                        top_k=1, profile=profile, with_what_ifs=False)
    except PlacerError as exc:
        assert "\n" not in str(exc)
        return
    check_invariants(rec.plan)
