"""The cost model's caches (placer.cost.memo) return what the same inputs compute afresh.

What-ifs search the same model again at half and twice the global batch and on twice the nodes;
``estimate`` and ``memory_estimate`` then find a layout's micro-batch, data-parallel traffic and
memory cached. A key that left out something a figure depends on would hand one problem's
figure to another: each case here is costed with every cache empty, then again after the
caches were filled by the other batches, ZeRO stages and cluster sizes, and must be equal.
"""

from __future__ import annotations

import itertools

import pytest

from placer.cost import estimate, memory_estimate
from placer.cost.memo import clear_caches
from placer.cost.options import CostOptions
from placer.cost.pipeline import microbatches_in_flight, saturated_microbatches
from placer.spec import Job, Layout
from placer.spec.presets import cluster_preset, model_preset

LAYOUTS = [
    Layout(tp=8, pp=4, dp=2, vpp=2, micro_batch_size=1, zero_stage=1, sequence_parallel=True),
    Layout(tp=4, pp=2, dp=4, cp=2, micro_batch_size=2, zero_stage=2, recompute="full"),
    Layout(tp=2, pp=8, dp=4, micro_batch_size=1, zero_stage=3, schedule="gpipe"),
    Layout(tp=8, pp=1, dp=8, micro_batch_size=1, zero_stage=3, recompute="selective"),
    Layout(tp=4, pp=4, dp=4, micro_batch_size=1, zero_stage=0, schedule="zbv", vpp=2),
]


def _variants(layout: Layout) -> list[Layout]:
    """The layouts a search costs beside ``layout``: other ZeRO stages, twice the DP degree."""
    others = [layout.model_copy(update={"zero_stage": z}) for z in range(4)]
    return others + [layout.model_copy(update={"dp": 2 * layout.dp})]


@pytest.mark.parametrize("model_name", ["llama3-70b", "mixtral-8x7b"])
def test_cached_estimates_equal_fresh_ones(model_name: str) -> None:
    model = model_preset(model_name)
    cluster = cluster_preset("dgx-h100").with_nodes(8)
    bigger = cluster.with_nodes(16)
    jobs = {batch: Job(seq_len=4096, global_batch_size=batch) for batch in (64, 128, 256)}
    fresh = {}
    for layout, batch in itertools.product(LAYOUTS, jobs):
        clear_caches()
        fresh[layout, batch] = (estimate(model, cluster, jobs[batch], layout),
                                memory_estimate(model, cluster, jobs[batch], layout))
    clear_caches()
    for layout, batch in itertools.product(LAYOUTS, jobs):  # the caches fill as a search would
        for other in _variants(layout):
            estimate(model, bigger if other.dp > layout.dp else cluster, jobs[batch], other)
        for other_batch in jobs:
            memory_estimate(model, cluster, jobs[other_batch], layout)
    for (layout, batch), (est, memory) in fresh.items():
        assert estimate(model, cluster, jobs[batch], layout) == est, (layout.compact(), batch)
        assert memory_estimate(model, cluster, jobs[batch], layout) == memory


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "gpipe", "zb1p", "zbv", "dualpipe",
                                      "dualpipev"])
def test_saturated_microbatches_hold_what_the_batch_holds(schedule: str) -> None:
    """Every stage holds as many micro-batches in flight at the saturated count as at the real
    one (the memory cache keys on it)."""
    for pp, vpp, m in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 5), range(1, 40)):
        if schedule in ("zbv", "dualpipev") and vpp != 2:
            continue
        if schedule in ("1f1b", "gpipe", "zb1p", "dualpipe") and vpp != 1:
            continue
        layout = Layout(pp=pp, vpp=vpp, schedule=schedule)
        saturated = saturated_microbatches(layout, m)
        assert saturated <= m
        for stage in range(pp):
            assert (microbatches_in_flight(layout, stage, saturated)
                    == microbatches_in_flight(layout, stage, m)), (pp, vpp, m, stage)


def test_layer_work_reads_only_its_key_fields() -> None:
    """``layer_work`` is cached on ``compute.LAYER_FIELDS`` of the layout: layouts that differ
    in every other field get the same work computed afresh (a field it starts to read must
    join the key)."""
    from placer.cost.compute import LAYER_FIELDS, _layer_work

    job = Job(seq_len=4096, global_batch_size=256)
    for model in (model_preset("llama3-70b"), model_preset("mixtral-8x7b"),
                  model_preset("deepseek-v3")):
        for base in LAYOUTS:
            others = [*_variants(base), base.model_copy(update={"pp": 2 * base.pp}),
                      base.model_copy(update={"recompute": "full", "offload_layers": 1}),
                      base.model_copy(update={"vpp": 1, "schedule": None})]
            for moe in (False, True) if model.moe is not None else (False,):
                expected = _layer_work(model, job, base, moe, CostOptions())
                for other in others:
                    assert all(getattr(other, f) == getattr(base, f) for f in LAYER_FIELDS)
                    assert _layer_work(model, job, other, moe, CostOptions()) == expected


def test_a_dense_layer_reads_no_expert_degree() -> None:
    """A dense layer's work (an MoE model's dense layers, or a dense model's) is the same for
    every (ep, etp) split, so it is cached on ``compute.DENSE_LAYER_FIELDS``; an MoE layer's is
    not (its experts and dispatch are split over ep and etp), which the key keeps apart."""
    from placer.cost.compute import DENSE_LAYER_FIELDS, LAYER_FIELDS, _layer_work

    assert set(DENSE_LAYER_FIELDS) == set(LAYER_FIELDS) - {"ep", "etp"}
    job = Job(seq_len=4096, global_batch_size=256)
    for model in (model_preset("mixtral-8x7b"), model_preset("deepseek-v3")):
        for base in LAYOUTS:
            splits = [base.model_copy(update={"ep": ep, "etp": etp})
                      for ep, etp in ((1, 1), (2, 1), (8, 1), (4, 2), (2, base.tp))]
            dense = {_layer_work(model, job, split, False, CostOptions()) for split in splits}
            moe = {_layer_work(model, job, split, True, CostOptions()) for split in splits}
            assert len(dense) == 1 and len(moe) > 1
