"""torchtitan's eager modules in the step time: async TP's backward reduce-scatters and the
element-wise traffic of uncompiled blocks (docs/sources.md 7.2)."""

from __future__ import annotations

import pytest

from placer.cost import estimate
from placer.cost.compute import layer_work, tokens_per_gpu
from placer.cost.memory import activation_bytes_per_token
from placer.cost.options import CostOptions
from placer.spec import Job, Layout
from placer.spec.presets import cluster_preset, model_preset

MODEL = model_preset("llama3-70b")
CLUSTER = cluster_preset("dgx-h100").with_nodes(1)
JOB = Job(seq_len=8192, global_batch_size=8)
LAYOUT = Layout.parse("tp=8,dp=1,mbs=1,sp=on")


def _tp(fused: bool, overlap: bool) -> tuple[float, float]:
    """(exposed TP seconds per step, time of one TP reduce-scatter call)."""
    est = estimate(MODEL, CLUSTER, JOB, LAYOUT,
                   options=CostOptions(fused_kernels=fused, tp_comm_overlap=overlap))
    rs = next(c for c in est.collectives
              if c.dimension == "tp" and c.collective == "reduce_scatter")
    # The sequence-parallel reduce-scatter moves one micro-batch's hidden states in bf16.
    assert rs.message_bytes == 8192 * MODEL.hidden_size * 2
    return est.breakdown.tp_exposed_s, rs.time_s / rs.calls_per_step


def test_async_tp_leaves_the_summed_input_gradient_reduce_scatters_exposed() -> None:
    """Eager wq/wk/wv and w1/w3 sum their input gradients before the backward reduce-scatter,
    which torch's micro-pipeline pass cannot fuse: at least two whole reduce-scatters per layer
    and micro-batch stay on the critical path, where fused projections hide all but 1/tp."""
    layers_times_m = MODEL.num_layers * 8
    eager, rs = _tp(fused=False, overlap=True)
    fused, _ = _tp(fused=True, overlap=True)
    off, _ = _tp(fused=False, overlap=False)
    assert eager >= 2 * rs * layers_times_m * (1 - 1e-9)
    assert 0 < eager - fused <= 2 * rs * layers_times_m * (1 - 1 / 8) * (1 + 1e-9)
    assert eager < off
    # Without async TP nothing changes: every collective is exposed either way.
    assert _tp(fused=True, overlap=False)[0] == pytest.approx(off)


def test_uncompiled_eager_blocks_move_their_eager_tensors() -> None:
    """Element-wise traffic scales with the stored bytes of the kernels that run: the eager
    modules' (memory.activation_bytes_per_token, checked against PyTorch blocks in
    tests/test_memory_pytorch.py) without torch.compile, the fused kernels' once compiled."""
    tokens = tokens_per_gpu(JOB, LAYOUT)
    eager = activation_bytes_per_token(MODEL, LAYOUT, False, fused_kernels=False).total
    fused = activation_bytes_per_token(MODEL, LAYOUT, False).total
    assert eager > fused
    work = {compiled: layer_work(MODEL, JOB, LAYOUT, False,
                                 CostOptions(fused_kernels=False, compiled_layers=compiled))
            for compiled in (False, True)}
    assert work[False].elementwise_bytes == pytest.approx(eager * tokens)
    assert work[True].elementwise_bytes == pytest.approx(fused * tokens)
    assert layer_work(MODEL, JOB, LAYOUT, False).elementwise_bytes == pytest.approx(
        fused * tokens)
    slow = estimate(MODEL, CLUSTER, JOB, LAYOUT, options=CostOptions(fused_kernels=False))
    quick = estimate(MODEL, CLUSTER, JOB, LAYOUT,
                     options=CostOptions(fused_kernels=False, compiled_layers=True))
    assert slow.breakdown.compute_s > quick.breakdown.compute_s


def test_grand_teton_hbm_is_the_benchmark_pages_figure() -> None:
    """'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth'
    (torchtitan's Dec 2024 benchmark page, Hardware)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import accuracy

    gpu = accuracy._grand_teton(1).node_types[0].gpu
    assert gpu.hbm_bandwidth_bytes_per_s == 2.4e12
