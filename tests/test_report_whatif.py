"""Each what-if's best layout is what a fresh search of the varied problem returns."""

from __future__ import annotations

import pytest

from placer.cli.options import load_job_inputs
from placer.cli.recommend_command import args_from_argv
from placer.report.describe import same_shape
from placer.report.plan import plan_in_steps, with_what_ifs_solved
from placer.report.whatif import early_variants, variants
from placer.solver import recommend
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.model import Model


def _inputs(*argv: str) -> tuple[Model, Cluster, Job, int]:
    """The problem exactly as ``placer recommend-layout ARGV`` builds it."""
    args = args_from_argv(["--quiet", *argv])
    inputs = load_job_inputs(args.model, args.cluster, nodes=args.nodes,
                             global_batch=args.global_batch, seq_len=args.seq_len,
                             precision=args.precision, constraints=args.constraints,
                             knobs=args.knobs)
    return inputs.model, inputs.cluster, inputs.job, args.top_k


def _assert_what_ifs_are_fresh_searches(model: Model, cluster: Cluster, job: Job,
                                        top_k: int) -> None:
    """The command's what-ifs (``plan_in_steps``, as recommend-layout runs it) against a fresh
    ``recommend`` of each variant with the same top-k: the same #1 layout and step time, and
    the explanation says the answer holds at a variant exactly when that #1 has the main
    answer's shape."""
    head, solving = plan_in_steps(model, cluster, job, top_k=top_k, rank_maps=False)
    solved = list(solving)
    wanted = variants(cluster, job)
    assert [w.label for w in solved] == [label for label, _, _ in wanted] and solved
    best = head.plan.candidates[0]
    holds = next((line for line in with_what_ifs_solved(head, solved).plan.explanation
                  if line.startswith("The answer holds")), "")
    for what, (label, variant_cluster, variant_job) in zip(solved, wanted, strict=True):
        fresh = recommend(model, variant_cluster, variant_job, top_k=top_k,
                          rank_maps=False).candidates[0]
        assert what.layout == fresh.layout, label
        assert what.step_time_s == pytest.approx(fresh.step_time_s, rel=1e-12), label
        assert (label in holds) == same_shape(fresh.layout, best.layout), (label, holds)


def test_what_ifs_are_fresh_searches_of_each_variant_small_cluster() -> None:
    """All three variants (both batches and twice the nodes) on two DGX H100."""
    model, cluster, job, top_k = _inputs("--model", "llama3-8b", "--cluster", "dgx-h100",
                                         "--nodes", "2", "--seq-len", "4096",
                                         "--global-batch", "64", "--top", "3")
    assert len(variants(cluster, job)) == 3
    _assert_what_ifs_are_fresh_searches(model, cluster, job, top_k)


def test_what_ifs_are_fresh_searches_where_the_main_table_is_small() -> None:
    """Llama 3.1 405B on 16,384 H100 (bench/search_speed.py's problem, default flags; ~12 s on a
    quiet core, the cheapest problem found where it matters): the main table keeps only the few
    tuples within reach of its top 5, and twice the batch's best layout lies outside them
    (re-ranking the main table's tuples said "The answer holds at twice the global batch")."""
    _assert_what_ifs_are_fresh_searches(*_inputs("--model", "llama3-405b", "--cluster",
                                                 "dgx-h100", "--nodes", "2048"))


def test_the_variant_on_another_cluster_starts_beside_the_main_search() -> None:
    """With one free core, twice the nodes (a new data-parallel degree: it reuses least of the
    main search's costed pieces) starts first; with none, nothing starts early; with more,
    the batch variants follow in the explanation's order."""
    model, cluster, job, _ = _inputs("--model", "llama3-8b", "--cluster", "dgx-h100",
                                     "--nodes", "2", "--seq-len", "4096",
                                     "--global-batch", "64")
    found = variants(cluster, job)
    assert [label.split(" (")[0] for label, _, _ in found] == [
        "twice the global batch", "half the global batch", "twice the nodes"]
    assert early_variants(found, cluster, 1) == [2]
    assert early_variants(found, cluster, 0) == []
    assert early_variants(found, cluster, 3) == [2, 0, 1]
    big = cluster.with_nodes(4096 // 8)  # too many GPUs to double: the batches alone
    assert early_variants(variants(big, job), big, 1) == [0]
