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
from placer.cost.bound import compute_floor, layer_floor, with_exposure
from placer.cost.memo import clear_caches
from placer.cost.options import CostOptions
from placer.cost.pipeline import microbatches_in_flight, saturated_microbatches
from placer.cost.profile import calibration_for
from placer.cost.stack_options import job_options
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


@pytest.mark.parametrize("model_name", ["llama3-70b", "mixtral-8x7b"])
def test_cached_floors_equal_fresh_ones(model_name: str) -> None:
    """The search's floors (placer.cost.bound) cache their per-micro-batch parts without the
    global batch: after the caches were filled at the other batches, each floor at a batch is
    the one computed with every cache empty."""
    model = model_preset(model_name)
    cluster = cluster_preset("dgx-h100").with_nodes(8)
    calib = calibration_for(cluster, None)
    jobs = {batch: Job(seq_len=4096, global_batch_size=batch) for batch in (64, 128, 256)}

    def floors(layout: Layout, job: Job) -> tuple[object, ...]:
        options = job_options(job)
        compute = compute_floor(model, job, layout, calib, options)
        exposed = with_exposure(model, cluster, job, layout, compute, calib, options)
        return ((compute.work_s, compute.bubble_s), (exposed.work_s, exposed.bubble_s),
                layer_floor(model, job, layout, calib, options))

    fresh = {}
    for layout, batch in itertools.product(LAYOUTS, jobs):
        clear_caches()
        fresh[layout, batch] = floors(layout, jobs[batch])
    clear_caches()
    for layout in LAYOUTS:  # each batch-free entry is made at the first batch, 64
        for other_batch in jobs:
            floors(layout, jobs[other_batch])
    for (layout, batch), expected in fresh.items():
        assert floors(layout, jobs[batch]) == expected, (layout.compact(), batch)
    assert fresh[LAYOUTS[0], 64] != fresh[LAYOUTS[0], 128]  # the batch does enter the floor


def test_stage_compute_reads_no_data_parallel_field() -> None:
    """``compute_floor`` caches its stages' compute without the layout's data-parallel fields
    (memo.DP_FIELDS), so twice the nodes finds the main search's: layouts that differ only
    there get the same stages computed afresh, and their floors after the cache was filled by
    the others are those computed with every cache empty (the micro-batch count, which the data
    parallelism sets, is applied outside the cache)."""
    from placer.cost.bound import _stage_times
    from placer.cost.memo import DP_FIELDS

    cluster = cluster_preset("dgx-h100").with_nodes(8)
    calib = calibration_for(cluster, None)
    job = Job(seq_len=4096, global_batch_size=256)
    options = job_options(job)
    for model in (model_preset("llama3-70b"), model_preset("deepseek-v3")):
        for base in LAYOUTS:
            others = [other for other in (
                *_variants(base), base.model_copy(update={"dp": 4 * base.dp, "dp_shard": base.dp}),
                base.model_copy(update={"zero_stage": 3, "reshard_after_forward": False}))
                if any(getattr(other, f) != getattr(base, f) for f in DP_FIELDS)]
            expected = _stage_times(model, job, base, calib, options)
            fresh = {}
            for other in others:
                assert _stage_times(model, job, other, calib, options) == expected
                clear_caches()
                floor = compute_floor(model, job, other, calib, options)
                fresh[other] = (floor.work_s, floor.bubble_s)
            clear_caches()
            compute_floor(model, job, base, calib, options)
            for other in others:
                floor = compute_floor(model, job, other, calib, options)
                assert (floor.work_s, floor.bubble_s) == fresh[other], other.compact()
            assert len(set(fresh.values())) > 1  # the data parallelism does enter the floor


def test_a_memory_check_and_an_estimate_of_one_layout_share_the_memory() -> None:
    """memory_estimate without options resolves the job's own before keying its cache, so the
    estimate (which passes them resolved) finds the search's memory check of the layout."""
    model = model_preset("llama3-70b")
    cluster = cluster_preset("dgx-h100").with_nodes(8)
    job = Job(seq_len=4096, global_batch_size=64)
    clear_caches()
    checked = memory_estimate(model, cluster, job, LAYOUTS[0])
    assert memory_estimate(model, cluster, job, LAYOUTS[0], job_options(job)) is checked
    assert estimate(model, cluster, job, LAYOUTS[0]).memory == checked


def test_cached_flops_per_token_equal_fresh_ones() -> None:
    """Model and recomputation FLOPs (an estimate's MFU and HFU) are cached per token under the
    model's text, the sequence and the layout's recompute fields, pp and vpp: each equals the
    same figure costed with every cache empty, after the others filled the caches."""
    from placer.cost.compute import model_flops_per_step, recompute_flops_per_step

    models = [model_preset(name) for name in ("llama3-70b", "mixtral-8x7b", "deepseek-v3")]
    jobs = [Job(seq_len=seq, global_batch_size=batch) for seq, batch in ((4096, 64),
                                                                         (8192, 128))]
    layouts = [Layout(tp=8, pp=pp, dp=1, vpp=vpp, micro_batch_size=1, recompute=mode, **extra)
               for pp, vpp in ((4, 1), (4, 2), (8, 1))
               for mode, extra in (("none", {}), ("full", {}), ("full", {"recompute_layers": 2}),
                                   ("selective", {}), ("op", {}),
                                   ("selective", {"recompute_modules": ("mlp", "moe")}))]
    cases = list(itertools.product(models, jobs, layouts))
    fresh = {}
    for index, (model, job, layout) in enumerate(cases):
        clear_caches()
        fresh[index] = (model_flops_per_step(model, job),
                        recompute_flops_per_step(model, job, layout))
    clear_caches()
    for model, job, layout in cases:  # fill the caches with every other case first
        model_flops_per_step(model, job)
        recompute_flops_per_step(model, job, layout)
    for index, (model, job, layout) in enumerate(cases):
        got = (model_flops_per_step(model, job), recompute_flops_per_step(model, job, layout))
        assert got == fresh[index], (model.name, job.seq_len, layout.compact())
    # and the figures differ where the inputs do (the keys are not too coarse)
    assert len({value[1] for value in fresh.values()}) > len(layouts)
