"""The baseline: the stack's published recipe (DP scaled) when one transfers, else the engineer's
rule (TP and EP in the NVLink domain, no CP below 16K, the smallest PP that fits, recompute only
when its memory is needed)."""

from __future__ import annotations

from placer.cost import estimate
from placer.report.baseline import (
    common_default,
    default_cp,
    nearest_recipes,
    recipe_layout,
    rule_default,
)
from placer.report.defaults import resolve_job
from placer.spec.layout import Layout
from placer.spec.presets import cluster_preset, model_preset
from placer.spec.recipe import published_recipes

H100_16_NODES = cluster_preset("dgx-h100").with_nodes(16)


def test_the_published_recipe_is_the_baseline_with_dp_scaled() -> None:
    model = model_preset("llama3-70b")
    job, _ = resolve_job(model, seq_len=8192, global_batch=None, constraints=("pp>=8",))
    base = common_default(model, H100_16_NODES, job, 128, estimate)
    # One of the three Llama 3 70B recipes of 64 H100 at 8K (the nearest that fits in BF16).
    assert base.recipe is not None and base.recipe.model == "llama3-70b"
    assert (base.recipe.num_gpus, base.recipe.seq_len) == (64, 8192)
    published = Layout.parse(base.recipe.layout, num_gpus=64)
    assert base.layout == published.model_copy(update={"dp": published.dp * 2})
    assert base.estimate is not None and base.estimate.fits  # constraints do not bind it


def test_a_shorter_sequence_keeps_the_recipe_tokens_per_cp_rank() -> None:
    recipe = next(r for r in published_recipes() if r.id == "nemo2407-llama3-70b-64xh100-fp8")
    model = model_preset("llama3-70b")
    job, _ = resolve_job(model, seq_len=4096, global_batch=256)
    layout, problem = recipe_layout(recipe, model, job, 64)
    assert problem == "" and layout is not None
    assert (layout.cp, layout.dp) == (1, 4)  # 8192 / CP 2 = 4096 tokens per rank, as published


def test_recipes_must_match_the_gpu_the_kind_and_the_size() -> None:
    ids = [r.id for r in nearest_recipes(model_preset("llama3-70b"), H100_16_NODES, 128,
                                         seq_len=8192)]
    assert ids[:3] == ["mbridge2602-llama3-70b-64xh100-fp8", "mbridge2511-llama3-70b-64xh100-fp8",
                       "nemo2407-llama3-70b-64xh100-fp8"]
    assert "nemo2407-llama2-70b-64xh100-fp8" in ids
    assert all("8b" not in i and "405b" not in i for i in ids)  # > 2x the parameters away
    a100 = cluster_preset("dgx-a100").with_nodes(16)
    assert nearest_recipes(model_preset("llama3-70b"), a100, 128) == []
    moe = [r.id for r in nearest_recipes(model_preset("qwen3-30b-a3b"), H100_16_NODES, 128)]
    assert moe and all("qwen3" in i for i in moe)


def test_the_rule_takes_tp_in_the_node_and_the_smallest_pp_that_fits() -> None:
    model = model_preset("llama3-70b")
    job, _ = resolve_job(model, seq_len=8192, global_batch=None)
    base = rule_default(model, H100_16_NODES, job, 128, estimate)
    assert base.layout is not None and base.estimate is not None and base.estimate.fits
    lay = base.layout
    assert (lay.tp, lay.cp, lay.micro_batch_size, lay.zero_stage) == (8, 1, 1, 1)
    assert lay.sequence_parallel and lay.tp * lay.pp * lay.dp == 128
    if lay.pp > 1:  # no smaller PP fits, whatever the recompute
        for recompute in ("none", "selective", "full"):
            smaller = lay.model_copy(update={"pp": lay.pp // 2, "dp": lay.dp * 2,
                                             "recompute": recompute})
            assert not estimate(model, H100_16_NODES, job, smaller).fits
    if lay.recompute != "none":  # recompute only when the memory it saves is needed
        plain = lay.model_copy(update={"recompute": "none"})
        assert not estimate(model, H100_16_NODES, job, plain).fits


def test_the_rule_keeps_experts_inside_the_nvlink_domain() -> None:
    model = model_preset("qwen3-30b-a3b")  # 128 experts: EP=128 would span 16 nodes
    job, _ = resolve_job(model, seq_len=4096, global_batch=None)
    base = rule_default(model, H100_16_NODES, job, 128, estimate)
    assert base.layout is not None and base.layout.ep == 8


def test_no_cp_below_16k_then_8k_tokens_per_rank() -> None:
    assert default_cp(8192, 64) == 1
    assert default_cp(12288, 64) == 1
    assert default_cp(16384, 64) == 2
    assert default_cp(32768, 8) == 4
    assert default_cp(131072, 256) == 16
    assert default_cp(131072, 4) == 4  # no more GPUs to split over


def test_no_baseline_when_nothing_fits_names_why() -> None:
    model = model_preset("llama3-405b")
    job, _ = resolve_job(model, seq_len=8192, global_batch=None)
    base = common_default(model, cluster_preset("dgx-h100"), job, 8, estimate)
    assert base.layout is None and base.estimate is None
    assert base.note.startswith("it does not fit at any PP degree with TP=8")


def test_no_valid_rule_names_the_rule_it_breaks() -> None:
    model = model_preset("llama3-8b")
    job, _ = resolve_job(model, seq_len=5, global_batch=3)
    base = common_default(model, cluster_preset("dgx-h100"), job, 8, estimate)
    assert base.layout is None
    assert base.note == ("no PP degree gives a valid layout with TP=8 on 8 GPUs (at PP=1: "
                         "layout.tp=8 with sequence parallelism tp must divide seq_len=5)")
