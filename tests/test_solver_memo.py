"""A search of the same job under one more constraint reuses the first search's costs and gets
the table a search from scratch gets (prefer.py's validated search relies on it)."""

from __future__ import annotations

from placer.solver.search import search_space
from placer.solver.table import CostMemo, build_table
from placer.spec.job import Job
from placer.spec.presets import cluster_preset, model_preset


def test_a_constrained_search_reuses_the_memo_and_matches_a_fresh_one() -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(1)
    job = Job(seq_len=8192, global_batch_size=64)
    memo = CostMemo()
    build_table(model, cluster, job, search_space(model, cluster, job).degrees, keep=3, memo=memo)
    costed = dict(memo.estimates)
    assert costed
    narrower = Job(seq_len=8192, global_batch_size=64, constraints=["cp<=1"])
    degrees = search_space(model, cluster, narrower).degrees
    again, _ = build_table(model, cluster, narrower, degrees, keep=3, memo=memo)
    fresh, _ = build_table(model, cluster, narrower, degrees, keep=3)
    assert [(r.layout, r.step_time_s, r.memory_bytes) for r in again] == [
        (r.layout, r.step_time_s, r.memory_bytes) for r in fresh]
    reused = {id(v) for v in costed.values()}
    assert any(id(r.estimate) in reused for r in again)  # looked up, not costed again
