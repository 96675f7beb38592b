"""Expert GEMMs launched as a group: tiles, waves and fixed kernel times by hand.

Transformer Engine's GroupedLinear (Megatron --moe-grouped-gemm) issues one cuBLAS GEMM per
expert on stream ``i % 4`` (TransformerEngine v2.9-v2.13 multi_stream_cublas_gemm,
num_compute_streams = 4); torch._grouped_mm runs every expert in one kernel.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from placer.cost.compute import (
    TE_GROUPED_GEMM_STREAMS,
    expert_gemm_group,
    gemm_times,
    layer_work,
    wave_efficiency,
)
from placer.cost.options import CostOptions
from placer.cost.profile import HBM_EFFICIENCY, MAMF_EFFICIENCY, calibration_for
from placer.spec import Job, Layout, Model
from placer.spec.model import MoE
from placer.spec.presets import cluster_preset


def test_pooled_tiles_share_waves_by_hand_on_132_sms() -> None:
    # One 256 x 256 expert GEMM (K = 4096) on H100's 132 SMs: 128x128 tiles give 4 tiles; split-K
    # min(132 // 4, 4096 // 512) = 8 ways -> 32 of 132 slots in one wave: 32/132. (256x128 and
    # 128x256 give 2 tiles x 8 = 16 slots: 16/132.)
    assert wave_efficiency(256, 256, 4096, 132) == pytest.approx(32 / 132)
    # Four of them at once (4 streams): 16 tiles, split min(132 // 16, 8) = 8 -> 128 of 132.
    assert wave_efficiency(256, 256, 4096, 132, 4) == pytest.approx(128 / 132)
    # Sixteen at once (one grouped kernel): 64 tiles, split min(2, 8) = 2 -> 128 slots, one wave.
    assert wave_efficiency(256, 256, 4096, 132, 16) == pytest.approx(128 / 132)


def test_rounds_of_four_streams_pay_one_fixed_time_each() -> None:
    calib = replace(calibration_for(cluster_preset("dgx-h100")), gemm_sustained_fraction=1.0)
    rate = calib.peak_bf16_flops * MAMF_EFFICIENCY["H100"][0]  # 794.5 TFLOP/s
    fixed = calib.half_efficiency_flops("bf16") / rate
    bandwidth = 3.35e12 * HBM_EFFICIENCY  # H100 SXM HBM3
    m, n, k = 256.0, 256.0, 4096.0
    flops = 2 * m * n * k
    moved = 2 * (m * k + k * n) + 2 * m * n  # bf16 operands and output of one GEMM

    def round_s(size: int, busy: float) -> float:
        # ``size`` GEMMs at once: their FLOPs at the busy fraction of the SMs, or their bytes
        # at HBM bandwidth (a roofline), plus one fixed kernel time.
        return max(size * flops / (rate * busy), size * moved / bandwidth) + fixed

    # Serial: 16 kernels, each 32/132 of the SMs busy, each paying the fixed time.
    (serial,) = gemm_times(((flops, 16),), ((m, n, k),), calib, "bf16", (1,))
    assert serial == pytest.approx(16 * round_s(1, 32 / 132), rel=1e-9)
    # Four streams: 4 rounds of 4 concurrent GEMMs at 128/132 of the SMs.
    (streams,) = gemm_times(((flops, 16),), ((m, n, k),), calib, "bf16", (4,))
    assert streams == pytest.approx(4 * round_s(4, 128 / 132), rel=1e-9)
    # 18 experts in rounds of 4: four full rounds and one of the remaining 2 (64/132 busy).
    (uneven,) = gemm_times(((flops, 18),), ((m, n, k),), calib, "bf16", (4,))
    assert uneven == pytest.approx(4 * round_s(4, 128 / 132) + round_s(2, 64 / 132), rel=1e-9)
    # One grouped kernel: one fixed time for all 16.
    (single,) = gemm_times(((flops, 16),), ((m, n, k),), calib, "bf16", (16,), one_kernel=True)
    assert single == pytest.approx(round_s(16, 128 / 132), rel=1e-9)
    assert single < streams < serial


def test_gemms_that_fill_every_sm_run_one_after_another_on_streams() -> None:
    from placer.cost.compute import concurrent_gemms

    # 256 x 256 output: 4 tiles of 128x128, so 132 // 4 = 33 such GEMMs fit on the SMs at once.
    assert concurrent_gemms(256, 256, 132) == 33
    # 2048 x 2048: 256 tiles, more than 132 SMs: the next stream's GEMM waits for free SMs.
    assert concurrent_gemms(2048, 2048, 132) == 1
    calib = calibration_for(cluster_preset("dgx-h100"))
    m, n, k = 2048.0, 2048.0, 4096.0
    flops = 2 * m * n * k
    serial = gemm_times(((flops, 16),), ((m, n, k),), calib, "bf16", (1,))
    assert gemm_times(((flops, 16),), ((m, n, k),), calib, "bf16", (4,)) == serial
    # One grouped kernel still pools all 16 grids into one launch.
    assert gemm_times(((flops, 16),), ((m, n, k),), calib, "bf16", (16,), one_kernel=True)[0] < (
        serial[0])


SMALL_MOE = Model(name="small-moe", num_layers=2, hidden_size=1024, num_attention_heads=8,
                  ffn_hidden_size=4096, vocab_size=1000,
                  moe=MoE(num_experts=64, top_k=4, expert_ffn_hidden_size=512))


@pytest.mark.parametrize(("options", "group"), [
    (CostOptions(), TE_GROUPED_GEMM_STREAMS),
    (CostOptions(moe_grouped_kernel="single"), 16),
    (CostOptions(moe_grouped_gemm=False), 1),
])
def test_a_layers_expert_gemms_are_launched_as_the_stack_groups_them(
        options: CostOptions, group: int) -> None:
    # 64 experts over EP 4: 16 local experts; only the two expert GEMM entries are grouped.
    work = layer_work(SMALL_MOE, Job(seq_len=2048, global_batch_size=8), Layout(dp=4, ep=4),
                      True, options)
    assert expert_gemm_group(16, options) == group
    experts = [i for i, (_, count) in enumerate(work.gemms) if count == 16]
    assert len(experts) == 2
    assert [work.gemm_groups[i] for i in experts] == [group, group]
    assert work.gemm_one_kernel == (options.moe_grouped_kernel == "single")
    assert all(g == 1 for i, g in enumerate(work.gemm_groups) if i not in experts)
    # Fewer local experts than streams: all of them at once.
    assert expert_gemm_group(2, CostOptions()) == 2


def test_torchtitan_stack_runs_one_grouped_kernel() -> None:
    from placer.cost.stack_options import options_for
    from placer.spec.stack import load_stack

    job = Job(seq_len=2048, global_batch_size=8)
    assert options_for(job, load_stack("torchtitan")).moe_grouped_kernel == "single"
    assert options_for(job, load_stack("megatron-core")).moe_grouped_kernel == "te_streams"
    assert not options_for(job, load_stack("deepspeed")).moe_grouped_gemm


def test_an_moe_layer_waits_for_the_host_to_launch_its_experts_kernels() -> None:
    from placer.cost.compute import moe_host_launch_s, pass_times

    calib = replace(calibration_for(cluster_preset("dgx-h100")), moe_host_s_per_layer=1e-3,
                    moe_host_s_per_expert=1e-4)
    job, layout = Job(seq_len=256, global_batch_size=8), Layout(dp=4, ep=4)
    work = layer_work(SMALL_MOE, job, layout, True, CostOptions())
    # 16 local experts: 1 ms + 16 x 0.1 ms of launches per forward, twice that backward.
    assert work.launched_experts == 16
    assert moe_host_launch_s(work, calib) == pytest.approx(2.6e-3)
    gpu = pass_times(work, replace(calib, moe_host_s_per_layer=0.0, moe_host_s_per_expert=0.0),
                     "bf16", "none")
    assert gpu.forward_s < 2.6e-3  # 256 tokens: the GPU finishes first
    host_bound = pass_times(work, calib, "bf16", "none")
    assert host_bound.forward_s == pytest.approx(2.6e-3)
    assert host_bound.backward_s == pytest.approx(max(gpu.backward_s, 5.2e-3))
    # A CUDA-graphed iteration replays the kernels without the host; a dense layer has none.
    graphed = layer_work(SMALL_MOE, job, layout, True, CostOptions(cuda_graphs=True))
    assert moe_host_launch_s(graphed, calib) == 0.0
    assert pass_times(graphed, calib, "bf16", "none").forward_s == pytest.approx(gpu.forward_s)
    dense = layer_work(SMALL_MOE, job, layout, False, CostOptions())
    assert moe_host_launch_s(dense, calib) == 0.0
