"""The tables print no rank map, so the command's text path may skip writing them."""

from __future__ import annotations

from placer.report.defaults import resolve_job
from placer.report.plan import make_plan, plan_in_steps, with_what_ifs_solved
from placer.report.tables import render_text
from placer.spec.presets import cluster_preset, model_preset


def test_the_report_text_is_the_same_without_rank_maps() -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(2)
    job, _ = resolve_job(model, seq_len=4096, global_batch=64, constraints=(), precision="bf16")
    head, variants = plan_in_steps(model, cluster, job, top_k=3, rank_maps=False)
    bare = with_what_ifs_solved(head, list(variants))
    full = make_plan(model, cluster, job, top_k=3)
    assert all(c.rank_map == [] for c in bare.plan.candidates)
    assert all(len(c.rank_map) == c.layout.num_gpus for c in full.plan.candidates)
    assert render_text(bare) == render_text(full)
