"""What-ifs search the main table's degree tuples: the same answers as full searches."""

from __future__ import annotations

import pytest

from placer.report.defaults import resolve_job
from placer.report.whatif import tuples_for, variants, what_ifs
from placer.solver import recommend
from placer.spec.presets import cluster_preset, model_preset


@pytest.fixture(scope="module")
def problem():
    model = model_preset("llama3-8b")
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    job, _ = resolve_job(model, seq_len=4096, global_batch=64, constraints=(), precision="bf16")
    return model, cluster, job, recommend(model, cluster, job, top_k=3)


def test_what_ifs_match_full_searches_of_each_variant(problem) -> None:
    model, cluster, job, result = problem
    found = list(what_ifs(model, cluster, job, recommend, result.tuples))
    labels = [label for label, _, _ in variants(cluster, job)]
    assert [w.label for w in found] == labels and len(labels) == 3
    for what, (_, variant_cluster, variant_job) in zip(found, variants(cluster, job),
                                                       strict=True):
        full = recommend(model, variant_cluster, variant_job, top_k=1).candidates[0]
        assert what.layout == full.layout
        assert what.step_time_s == pytest.approx(full.step_time_s, rel=1e-12)


def test_twice_the_nodes_doubles_one_degree(problem) -> None:
    _, cluster, _, result = problem
    bigger = cluster.with_nodes(2 * cluster.num_nodes)
    first = result.tuples[0]
    grown = tuples_for(result.tuples[:1], cluster, bigger)
    assert [(g.tp // first.tp, g.pp // first.pp, g.dp // first.dp, g.cp // first.cp)
            for g in grown] == [(1, 1, 2, 1), (1, 2, 1, 1), (1, 1, 1, 2), (2, 1, 1, 1)]
    assert tuples_for(result.tuples, cluster, cluster) == result.tuples
    assert len(set(result.tuples)) == len(result.tuples)
