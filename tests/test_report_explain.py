"""The plain-language why: each sentence must follow from the numbers it is given."""

from __future__ import annotations

from test_report_plan import make_candidate

from placer.cost.validity import MODEL_ERROR
from placer.report.baseline import Baseline, default_tp
from placer.report.explain import explain, links_sentence, versus, versus_default, what_if_sentences
from placer.report.whatif import WhatIf, variants
from placer.spec import Layout
from placer.spec.job import Job
from placer.spec.presets import cluster_preset, model_preset
from placer.spec.recipe import published_recipes

MODEL = model_preset("llama3-70b")
CLUSTER = cluster_preset("dgx-h100").with_nodes(8)
JOB = Job(seq_len=8192, global_batch_size=512)
BEST = make_candidate(Layout(tp=8, pp=4, dp=2, zero_stage=1, recompute="selective",
                             sequence_parallel=True),
                      parts={"pp_bubble_s": 1.0, "dp_exposed_s": 0.3})
SECOND = make_candidate(Layout(tp=8, pp=8, dp=1, recompute="selective", sequence_parallel=True),
                        parts={"pp_bubble_s": 2.0, "pp_p2p_s": 0.5}, memory_gib=45.0)


def test_versus_names_the_gain_and_the_parts_that_explain_it() -> None:
    text = versus(BEST, SECOND, "#2")
    gain = SECOND.step_time_s / BEST.step_time_s - 1
    assert f"{gain * 100:.1f}% more tokens/s" in text
    assert "1.00 s less on pipeline bubble" in text
    assert "500 ms less on pipeline sends" in text
    assert "300 ms more on exposed gradient reduction" in text
    assert "#2 would leave more memory free (45.0 vs 60.0 GiB" in text


def test_versus_calls_near_equal_layouts_a_tie() -> None:
    close = make_candidate(Layout(tp=4, pp=8, dp=2, zero_stage=1),
                           parts={"pp_bubble_s": 1.0, "dp_exposed_s": 0.31})
    text = versus(BEST, close, "#2")
    assert "a tie within 0.5%" in text and "more tokens/s" not in text


def test_versus_explains_a_mesh_order_difference() -> None:
    reordered = make_candidate(BEST.layout, order=("tp", "dp", "cp", "pp"),
                               parts={"pp_bubble_s": 1.0, "dp_exposed_s": 0.6})
    text = versus(BEST, reordered, "#2")
    assert "the same degrees with ranks ordered tp-dp-cp-pp" in text


def test_versus_default_confirms_when_the_best_is_the_common_default() -> None:
    text = versus_default(MODEL, JOB, BEST, Baseline(BEST.layout, BEST))
    assert "placer confirms it" in text


def test_versus_default_quantifies_the_gain() -> None:
    text = versus_default(MODEL, JOB, BEST, Baseline(SECOND.layout, SECOND))
    assert text.startswith("Against the engineer's rule (TP inside the NVLink domain")
    assert ": TP=8, PP=8, DP=1" in text
    assert "more tokens/s" in text
    if SECOND.step_time_s / BEST.step_time_s - 1 >= MODEL_ERROR:
        assert f"beyond the model's measured error of {MODEL_ERROR:.1%}" in text
        assert "pipeline bubble" in text
    else:
        assert "a tie" in text


def test_a_gain_within_the_measured_error_is_a_tie_and_the_recipe_rank_is_named() -> None:
    near = make_candidate(Layout(tp=4, pp=8, dp=2, zero_stage=1),
                          parts={"pp_bubble_s": 1.0 + MODEL_ERROR * BEST.step_time_s / 2,
                                 "dp_exposed_s": 0.3})
    recipe = published_recipes()[0]
    text = versus_default(MODEL, JOB, BEST, Baseline(near.layout, near, recipe=recipe),
                          [BEST, SECOND, near])
    assert text.startswith(f"Against the published recipe {recipe.id} (NVIDIA/NeMo ")
    assert "a tie" in text and "within the cost model's measured error" in text
    assert text.endswith("It is #3 here.")


def test_versus_default_says_when_there_is_none() -> None:
    text = versus_default(MODEL, JOB, BEST, Baseline(None, None, "it does not fit at any PP"))
    assert text.endswith("is not an option: it does not fit at any PP.")


def test_versus_default_blames_the_constraints_when_the_default_is_faster() -> None:
    fast = make_candidate(Layout(tp=8, pp=8, dp=1, recompute="selective",
                                 sequence_parallel=True), compute_s=9.0)
    constrained = Job(seq_len=8192, global_batch_size=512, constraints=["pp<=4"])
    text = versus_default(MODEL, constrained, BEST, Baseline(fast.layout, fast))
    assert "would be" in text and "your constraints rule it out (the job requires pp<=4)" in text


def test_links_sentence_uses_the_cluster_network_name() -> None:
    assert links_sentence(BEST, CLUSTER) == (
        "Links: TP=8 on NVLink (inside an NVLink domain); PP=4 on InfiniBand (across nodes); "
        "DP=2 on InfiniBand (across nodes).")
    l40s = cluster_preset("pcie-8x-l40s").with_nodes(2)
    pcie = make_candidate(Layout(tp=2, pp=4, dp=2), links={"tp": "pcie", "pp": "network",
                                                           "dp": "pcie"})
    text = links_sentence(pcie, l40s)
    assert "TP=2 on PCIe (inside a node, no NVLink)" in text and "PP=4 on RoCE" in text


def test_what_if_sentences_report_flips_holds_and_infeasible_variants() -> None:
    flipped = Layout(tp=8, pp=8, dp=1, micro_batch_size=2, zero_stage=1, recompute="selective",
                     sequence_parallel=True)
    more_nodes = BEST.layout.model_copy(update={"dp": 4})
    lines = what_if_sentences(BEST, [
        WhatIf("twice the global batch (1024 sequences)", flipped, 20.0),
        WhatIf("half the global batch (256 sequences)", None, None, "no layout fits in memory"),
        WhatIf("twice the nodes (16 nodes, 128 GPUs)", more_nodes, 6.0),
    ])
    assert lines[0].startswith("What would change the answer: at twice the global batch (1024 "
                               "sequences), PP=8 (not 4), mbs=2 (not 1) wins")
    assert lines[1].startswith("At half the global batch (256 sequences) no layout works (no "
                               "layout fits")
    assert lines[2] == "The answer holds at twice the nodes (16 nodes, 128 GPUs)."


def test_explain_is_deterministic_and_orders_its_sentences() -> None:
    what = [WhatIf("half the global batch (256 sequences)", BEST.layout, 6.0)]
    first = explain(MODEL, CLUSTER, JOB, [BEST, SECOND], Baseline(SECOND.layout, SECOND), what)
    again = explain(MODEL, CLUSTER, JOB, [BEST, SECOND], Baseline(SECOND.layout, SECOND), what)
    assert first == again
    assert first[0].startswith("Best: TP=8, PP=4, DP=2")
    assert first[1].startswith("Over #2") and first[2].startswith("Against the engineer's rule")
    assert first[3].startswith("Links:") and first[4].startswith("The answer holds")
    only = explain(MODEL, CLUSTER, JOB, [BEST], None, [])
    assert len(only) == 2


def test_default_tp_respects_the_nvlink_domain_and_the_heads() -> None:
    assert default_tp(MODEL, CLUSTER, 64) == 8
    assert default_tp(MODEL, cluster_preset("pcie-8x-l40s"), 8) == 1
    assert default_tp(model_preset("gpt3-175b"), cluster_preset("dgx-a100"), 8) == 8
    assert default_tp(model_preset("llama2-13b"), CLUSTER, 64) == 8  # 40 heads
    assert default_tp(MODEL, CLUSTER, 12) == 4  # 8 does not divide 12 GPUs


def test_variants_double_and_halve_the_batch_and_double_single_pool_clusters() -> None:
    labels = [label for label, _, _ in variants(CLUSTER, JOB)]
    assert labels == ["twice the global batch (1,024 sequences)",
                      "half the global batch (256 sequences)",
                      "twice the nodes (16 nodes, 128 GPUs)"]
    odd = Job(seq_len=8192, global_batch_size=511)
    assert len(variants(CLUSTER, odd)) == 2
    huge = cluster_preset("dgx-h100").with_nodes(512)
    assert [label.split(" (")[0] for label, _, _ in variants(huge, JOB)] == [
        "twice the global batch", "half the global batch"]
    data = CLUSTER.model_dump()
    data["excluded_gpus"] = [{"node": 3, "gpu": 1}]
    degraded = type(CLUSTER).model_validate(data)
    assert len(variants(degraded, JOB)) == 2


def test_explain_says_how_many_gpus_stay_idle_and_the_uneven_split() -> None:
    data = CLUSTER.model_dump()
    data["excluded_gpus"] = [{"node": 3, "gpu": 1}]
    degraded = type(CLUSTER).model_validate(data)
    used = make_candidate(Layout(tp=8, pp=4, dp=1, zero_stage=0, recompute="selective"))
    split = used.model_copy(update={"stage_layers": [21, 21, 19, 19]})
    lines = explain(MODEL, degraded, JOB, [split], None, [])
    assert "layers per pipeline stage 21/21/19/19" in lines[0]
    assert lines[1].startswith("It uses 32 of the 63 usable GPUs; the other 31 stay idle")
    assert "divide the global batch of 512, and TP the attention heads" in lines[1]


def test_a_recipe_with_the_degrees_of_a_candidate_says_which() -> None:
    recipe_layout = SECOND.layout.model_copy(update={"vpp": 2})
    recipe = make_candidate(recipe_layout, parts={"pp_bubble_s": 2.2})
    text = versus_default(MODEL, JOB, BEST, Baseline(recipe_layout, recipe), [BEST, SECOND])
    assert text.endswith(" #2 is it with VPP=1 (not 2).")
