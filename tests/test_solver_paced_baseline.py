"""A layout priced outside the search (a published recipe, the baseline) gets the uneven split by
GPU speed the search gives its picks, so "vs base" on a mixed cluster compares like with like."""

from __future__ import annotations

import pytest

from placer.cost import estimate
from placer.mesh import DEFAULT_ORDER
from placer.solver import paced_estimate
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout
from placer.spec.presets import cluster_preset, model_preset

JOB = Job(seq_len=4096, global_batch_size=64)


def _mixed(h100_nodes: int, a100_nodes: int) -> Cluster:
    h100, a100 = cluster_preset("dgx-h100"), cluster_preset("dgx-a100")
    pools = [{"node_type": h100.node_types[0].name, "count": h100_nodes}]
    if a100_nodes:
        pools.append({"node_type": a100.node_types[0].name, "count": a100_nodes})
    return Cluster.model_validate({
        "name": "mixed", "node_types": [h100.node_types[0].model_dump(),
                                        a100.node_types[0].model_dump()],
        "pools": pools, "network": h100.network.model_dump()})


def test_a_recipe_with_homogeneous_stages_runs_at_the_uneven_splits_pace() -> None:
    """Llama-3-8B, 32 layers, PP=4 with one node per stage (pp outermost): stages 0-1 on H100,
    2-3 on A100. Evenly, the A100 stages' 8 layers pace the step: 8 / 312 TFLOP/s. By GPU speed
    (989 against 312 TFLOP/s dense BF16) the best split is 12/12/4/4: max(12/989, 4/312) =
    4/312, half the even split's time, so compute, recompute and bubble halve."""
    model, cluster = model_preset("llama3-8b"), _mixed(2, 2)
    layout = Layout(tp=4, pp=4, dp=2, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    even = estimate(model, cluster, JOB, layout, order=DEFAULT_ORDER)
    paced = paced_estimate(model, cluster, JOB, even)
    b, p = even.breakdown, paced.breakdown
    assert p.compute_s == pytest.approx(b.compute_s * 0.5)
    assert p.pp_bubble_s == pytest.approx(b.pp_bubble_s * 0.5)
    assert p.tp_exposed_s == b.tp_exposed_s and p.dp_exposed_s == b.dp_exposed_s
    assert paced.step_time_s == pytest.approx(sum(p.model_dump().values()))
    assert paced.tokens_per_s == pytest.approx(JOB.tokens_per_step / paced.step_time_s)


def test_one_gpu_type_or_no_pipeline_leaves_the_step_alone() -> None:
    model = model_preset("llama3-8b")
    layout = Layout(tp=4, pp=4, dp=2, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    plain = _mixed(4, 0)
    est = estimate(model, plain, JOB, layout, order=DEFAULT_ORDER)
    assert paced_estimate(model, plain, JOB, est) is est
    flat = Layout(tp=4, pp=1, dp=8, micro_batch_size=1, zero_stage=1, sequence_parallel=True)
    mixed = _mixed(2, 2)
    est = estimate(model, mixed, JOB, flat, order=DEFAULT_ORDER)
    paced = paced_estimate(model, mixed, JOB, est)
    assert paced.step_time_s == est.step_time_s and paced.breakdown == est.breakdown
    # only MFU moves: of the 16 H100 and 16 A100 it runs on (989.4 and 312 TFLOP/s dense BF16)
    assert paced.mfu == pytest.approx(est.tflops_per_gpu / ((989.4 + 312.0) / 2), rel=1e-9)
