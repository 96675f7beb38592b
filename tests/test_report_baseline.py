"""The common default: TP in the NVLink domain, the smallest PP that fits, DP for the rest."""

from __future__ import annotations

from placer.cost import estimate
from placer.report.baseline import common_default, default_cp
from placer.report.defaults import resolve_job
from placer.spec.presets import cluster_preset, model_preset


def test_the_default_takes_the_smallest_pp_that_fits() -> None:
    model = model_preset("llama3-70b")
    cluster = cluster_preset("dgx-h100").with_nodes(8)
    job, _ = resolve_job(model, seq_len=None, global_batch=None, constraints=("pp>=8",))
    base = common_default(model, cluster, job, 64, estimate)
    assert base.layout is not None and base.estimate is not None and base.estimate.fits
    lay = base.layout
    assert (lay.tp, lay.cp, lay.micro_batch_size, lay.zero_stage) == (8, 1, 1, 1)
    assert lay.recompute == "selective" and lay.sequence_parallel
    assert lay.tp * lay.pp * lay.dp == 64
    assert lay.pp < 8  # the user's constraints do not bind the yardstick
    if lay.pp > 1:
        smaller = lay.model_copy(update={"pp": lay.pp // 2, "dp": lay.dp * 2})
        assert not estimate(model, cluster, job, smaller).fits


def test_moe_defaults_spread_experts_over_the_expert_grid() -> None:
    model = model_preset("mixtral-8x22b")
    cluster = cluster_preset("dgx-h100").with_nodes(16)
    job, _ = resolve_job(model, seq_len=None, global_batch=None)
    base = common_default(model, cluster, job, 128, estimate)
    assert base.layout is not None and base.layout.ep == 8


def test_no_default_on_a_pcie_box_that_cannot_hold_the_model_without_tp() -> None:
    model = model_preset("llama3-8b")
    cluster = cluster_preset("pcie-8x-l40s")
    job, _ = resolve_job(model, seq_len=None, global_batch=None)
    base = common_default(model, cluster, job, 8, estimate)
    assert base.layout is None and base.estimate is None
    assert base.note.startswith("it does not fit at any PP degree with TP=1")


def test_long_contexts_get_cp_up_to_8k_tokens_per_rank() -> None:
    assert default_cp(8192, 64) == 1
    assert default_cp(32768, 8) == 4
    assert default_cp(131072, 256) == 16
    assert default_cp(131072, 4) == 4  # no more GPUs to split over
    model = model_preset("llama3-405b")
    cluster = cluster_preset("dgx-h100").with_nodes(256)
    job, _ = resolve_job(model, seq_len=131072, global_batch=None)
    base = common_default(model, cluster, job, 2048, estimate)
    assert base.layout is None
    assert base.note.startswith("it does not fit at any PP degree with TP=8, CP=16")


def test_no_valid_default_names_the_rule_it_breaks() -> None:
    model = model_preset("llama3-8b")
    job, _ = resolve_job(model, seq_len=5, global_batch=3)
    base = common_default(model, cluster_preset("dgx-h100"), job, 8, estimate)
    assert base.layout is None
    assert base.note == ("no PP degree gives a valid layout with TP=8 on 8 GPUs (at PP=1: "
                         "layout.tp=8 with sequence parallelism tp must divide seq_len=5)")
