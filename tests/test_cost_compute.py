"""FLOPs and compute time: Narayanan's formulas, GQA, gated and MoE MLPs, recomputation, the GEMM
efficiency curve and FP8."""

from __future__ import annotations

from dataclasses import replace

import pytest

from placer.cost.compute import (
    forward_flops_per_token,
    gemm_time,
    layer_work,
    model_flops_per_step,
    pass_times,
    recompute_flops_per_step,
)
from placer.cost.options import CostOptions
from placer.cost.params import total_params
from placer.cost.profile import HBM_EFFICIENCY, calibration_for
from placer.spec import Job, Layout, Model
from placer.spec.model import MoE
from placer.spec.presets import cluster_preset, model_preset

GPT175 = model_preset("gpt3-175b")


def test_model_flops_match_narayanan_72_formula_for_gpt() -> None:
    # 72 B s l h^2 (1 + s/6h + V/12lh) (docs/sources.md 9.3) for MHA, FFN 4h, no GLU.
    job = Job(seq_len=2048, global_batch_size=1536)
    b, s, lay, h, v = 1536, 2048, 96, 12288, 51200
    expected = 72 * b * s * lay * h * h * (1 + s / (6 * h) + v / (12 * lay * h))
    # Norms and biases carry no FLOPs here, as in the formula.
    assert model_flops_per_step(GPT175, job) == pytest.approx(expected, rel=1e-3)


def test_full_recompute_adds_one_forward_of_the_layers() -> None:
    job = Job(seq_len=2048, global_batch_size=1536)
    b, s, lay, h, v = 1536, 2048, 96, 12288, 51200
    hardware = model_flops_per_step(GPT175, job) + recompute_flops_per_step(
        GPT175, job, Layout(recompute="full"))
    eq3 = 96 * b * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))
    assert hardware == pytest.approx(eq3, rel=1e-3)
    assert recompute_flops_per_step(GPT175, job, Layout(recompute="none")) == 0.0
    selective = recompute_flops_per_step(GPT175, job, Layout(recompute="selective"))
    assert selective == pytest.approx(b * s * lay * 4 * s * h)


def test_gqa_gated_and_moe_forward_flops() -> None:
    llama = model_preset("llama3-8b")
    h, f, g, a, d, v, lay = 4096, 14336, 8, 32, 128, 128256, 32
    s = 8192
    per_layer = 2 * h * d * (2 * a + 2 * g) + 4 * a * d * s + 3 * 2 * h * f
    assert forward_flops_per_token(llama, s) == pytest.approx(lay * per_layer + 2 * h * v)
    mixtral = model_preset("mixtral-8x7b")
    dense_equiv = mixtral.model_copy(update={"moe": None})
    extra_per_layer = 2 * 4096 * 8 + 2 * 3 * 2 * 4096 * 14336 - 3 * 2 * 4096 * 14336
    assert forward_flops_per_token(mixtral, s) - forward_flops_per_token(dense_equiv, s) == (
        pytest.approx(32 * extra_per_layer))


def test_total_params_of_presets_are_close_to_their_names() -> None:
    assert total_params(model_preset("llama3-70b")) == pytest.approx(70.6e9, rel=0.01)
    assert total_params(model_preset("llama3-405b")) == pytest.approx(405.9e9, rel=0.01)
    assert total_params(model_preset("mixtral-8x7b")) == pytest.approx(46.7e9, rel=0.01)


def test_gemm_efficiency_falls_as_gemms_shrink() -> None:
    peak, eff, half = 1e15, 0.7, 1e10
    assert gemm_time(1e13, peak, eff, half) == pytest.approx((1e13 + 1e10) / 7e14)
    big = 1e13 / gemm_time(1e13, peak, eff, half) / peak
    small = 1e10 / gemm_time(1e10, peak, eff, half) / peak
    assert big == pytest.approx(eff * 1e13 / (1e13 + half))
    assert small == pytest.approx(eff / 2)


def test_tensor_parallelism_splits_the_layer_and_lowers_efficiency() -> None:
    calib = calibration_for(cluster_preset("dgx-h100"))
    job = Job(seq_len=4096, global_batch_size=8)
    model = model_preset("llama3-8b")
    t1 = pass_times(layer_work(model, job, Layout(tp=1), False), calib, "bf16", "none")
    t8 = pass_times(layer_work(model, job, Layout(tp=8, sequence_parallel=True), False), calib,
                    "bf16", "none")
    assert t8.total_s > t1.total_s / 8  # splitting 8 ways is not 8x faster
    assert t8.total_s < t1.total_s / 4


def test_recompute_modes_and_fp8() -> None:
    calib = calibration_for(cluster_preset("dgx-h100"))
    job = Job(seq_len=4096, global_batch_size=8)
    model = model_preset("llama3-8b")
    work = layer_work(model, job, Layout(), False)
    none = pass_times(work, calib, "bf16", "none")
    full = pass_times(work, calib, "bf16", "full")
    selective = pass_times(work, calib, "bf16", "selective")
    assert none.recompute_s == 0.0
    assert full.recompute_s == pytest.approx(full.forward_s)
    assert 0.0 < selective.recompute_s < full.recompute_s
    fp8 = pass_times(work, calib, "fp8", "none")
    assert fp8.total_s < none.total_s
    # Attention stays in BF16, so FP8 cannot halve the layer.
    assert fp8.total_s > none.total_s / 2


def test_unfused_attention_runs_the_whole_square_and_moves_scores() -> None:
    calib = calibration_for(cluster_preset("dgx-a100"))
    job = Job(seq_len=2048, global_batch_size=8)
    layout = Layout(tp=8)
    fused = layer_work(GPT175, job, layout, False)
    unfused = layer_work(GPT175, job, layout, False, CostOptions(flash_attention=False))
    assert fused.attention_flops > 0 and fused.score_bytes == 0
    assert unfused.attention_flops == 0
    assert sum(f * n for f, n in unfused.attention_gemms) == pytest.approx(
        2 * fused.attention_flops)  # no causal skipping
    assert unfused.score_bytes == pytest.approx(5 * 96 * 2048 / 8 * 2048)
    slow = pass_times(unfused, calib, "bf16", "selective")
    assert slow.recompute_s > 0


# A small fine-grained MoE: 16 experts of FFN 512, top-4, hidden 1024 (hand-computable).
SMALL_MOE = Model(name="small-moe", num_layers=2, hidden_size=1024, num_attention_heads=8,
                  ffn_hidden_size=4096, vocab_size=1000,
                  moe=MoE(num_experts=16, top_k=4, expert_ffn_hidden_size=512))


def test_expert_gemms_run_at_the_per_expert_size() -> None:
    # tokens_per_expert = tokens x top_k x ep / experts: each GPU's 4 local experts receive the
    # routed tokens of the whole EP group; each is its own GEMM of that many rows.
    job = Job(seq_len=2048, global_batch_size=8)
    layout = Layout(dp=4, ep=4)
    work = layer_work(SMALL_MOE, job, layout, True, CostOptions(moe_load_imbalance=1.0))
    per_expert = 2048 * 4 * 4 / 16  # 2048 rows
    assert (2 * per_expert * 1024 * 512 * 2, 4) in work.gemms  # gate and up, fused
    assert (2 * per_expert * 512 * 1024, 4) in work.gemms  # down
    skewed = layer_work(SMALL_MOE, job, layout, True, CostOptions(moe_load_imbalance=1.25))
    assert (2 * 1.25 * per_expert * 512 * 1024, 4) in skewed.gemms
    # Efficiency is that of the per-expert GEMM, not of one GEMM of all routed tokens.
    calib = calibration_for(cluster_preset("dgx-h100"))
    half = calib.half_efficiency_flops("bf16")
    one = gemm_time(2 * per_expert * 512 * 1024, 1.0, 1.0, half)
    fused = gemm_time(4 * 2 * per_expert * 512 * 1024, 1.0, 1.0, half)
    assert 4 * one > fused


def test_moe_dispatcher_passes_are_charged_at_hbm_bandwidth() -> None:
    job = Job(seq_len=2048, global_batch_size=8)
    tokens, h, e = 2048, 1024, 16
    routed = tokens * 4  # top-4, balanced
    router = 3 * tokens * e * 4  # softmax read + write, top-k read, fp32 logits
    several = layer_work(SMALL_MOE, job, Layout(dp=4, ep=4), True,
                         CostOptions(moe_load_imbalance=1.0))
    # permute (read + write), unpermute (read) and its tokens x h write, plus sorting the
    # received chunks by local expert and back (2 x read + write).
    assert several.dispatch_bytes == pytest.approx((7 * routed + tokens) * h * 2 + router)
    one_each = layer_work(SMALL_MOE, job, Layout(dp=16, ep=16), True,
                          CostOptions(moe_load_imbalance=1.0))
    assert one_each.dispatch_bytes == pytest.approx((3 * routed + tokens) * h * 2 + router)
    assert layer_work(SMALL_MOE, job, Layout(dp=4, ep=4), False).dispatch_bytes == 0.0
    calib = calibration_for(cluster_preset("dgx-h100"))
    with_dispatch = pass_times(several, calib, "bf16", "none")
    without = pass_times(replace(several, dispatch_bytes=0.0), calib, "bf16", "none")
    one_pass = several.dispatch_bytes / (calib.hbm_bytes_per_s * HBM_EFFICIENCY)
    # Forward permutes the tokens, backward permutes their gradients once more.
    assert with_dispatch.forward_s - without.forward_s == pytest.approx(one_pass)
    assert with_dispatch.backward_s - without.backward_s == pytest.approx(one_pass)
    full = pass_times(several, calib, "bf16", "full")
    assert full.recompute_s == pytest.approx(full.forward_s)


def test_fp8_gemms_pay_the_same_fixed_time_per_kernel() -> None:
    calib = calibration_for(cluster_preset("dgx-h100"))
    fixed = {p: calib.half_efficiency_flops(p) / (calib.peak_flops(p) * calib.gemm_efficiency(p))
             for p in ("bf16", "fp8")}
    assert fixed["fp8"] == pytest.approx(fixed["bf16"])
    assert calib.half_efficiency_flops("bf16") == calib.gemm.half_efficiency_flops
    assert calib.half_efficiency_flops("fp8") > calib.half_efficiency_flops("bf16")


def test_dispatcher_bookkeeping_is_charged_per_routed_token_copy() -> None:
    # Each pass pays the time per token copy this GPU's experts take, whatever the hidden size:
    # top-4 of 2048 tokens is 8192 copies, and doubling top_k doubles the charge. (The fitted
    # constant may be 0; a measured profile sets its own, so the mechanism is checked at 2 ns.)
    job = Job(seq_len=2048, global_batch_size=8)
    calib = replace(calibration_for(cluster_preset("dgx-h100")),
                    moe_dispatch_s_per_routed_token=2e-9)
    balanced = CostOptions(moe_load_imbalance=1.0)
    work = layer_work(SMALL_MOE, job, Layout(dp=4, ep=4), True, balanced)
    assert work.routed_tokens == 2048 * 4
    assert layer_work(SMALL_MOE, job, Layout(dp=4, ep=4), False).routed_tokens == 0.0
    with_it = pass_times(work, calib, "bf16", "none")
    without = pass_times(work, replace(calib, moe_dispatch_s_per_routed_token=0.0), "bf16",
                         "none")
    one_pass = 2048 * 4 * calib.moe_dispatch_s_per_routed_token
    assert with_it.forward_s - without.forward_s == pytest.approx(one_pass)
    assert with_it.backward_s - without.backward_s == pytest.approx(one_pass)
    moe = SMALL_MOE.moe
    assert moe is not None
    top8 = SMALL_MOE.model_copy(update={"moe": moe.model_copy(update={"top_k": 8})})
    assert layer_work(top8, job, Layout(dp=4, ep=4), True, balanced).routed_tokens == 2048 * 8
    wide = SMALL_MOE.model_copy(update={"hidden_size": 2048, "num_attention_heads": 16})
    assert layer_work(wide, job, Layout(dp=4, ep=4), True, balanced).routed_tokens == 2048 * 4


def test_a_measured_profile_replaces_the_dispatcher_constant() -> None:
    from placer.spec.profile import GemmProfile, LinkProfile

    cluster = cluster_preset("dgx-h100")
    profile = LinkProfile(gemm=GemmProfile(max_efficiency=0.7,
                                           moe_dispatch_s_per_routed_token=0.0))
    assert calibration_for(cluster, profile).moe_dispatch_s_per_routed_token == 0.0
    plain = LinkProfile(gemm=GemmProfile(max_efficiency=0.7))
    assert (calibration_for(cluster, plain).moe_dispatch_s_per_routed_token
            == calibration_for(cluster).moe_dispatch_s_per_routed_token)


def test_sliding_window_layers_attend_to_at_most_the_window() -> None:
    from placer.cost.compute import attended_keys_per_query

    dense = Model(name="d", num_layers=4, hidden_size=1024, num_attention_heads=8,
                  ffn_hidden_size=4096, vocab_size=1000)
    # min(i+1, w) averaged over i < s: w - w^2/(2s) for w <= s; a window as long as the
    # sequence is plain causal attention (s/2); half the layers windowed average the two.
    windowed = dense.model_copy(update={"sliding_window": 128})
    assert attended_keys_per_query(dense, 4096) == 2048
    assert attended_keys_per_query(windowed, 4096) == 128 - 128 * 128 / 8192
    exact = sum(min(i + 1, 128) for i in range(4096)) / 4096
    assert attended_keys_per_query(windowed, 4096) == pytest.approx(exact, rel=1e-3)
    assert attended_keys_per_query(dense.model_copy(update={"sliding_window": 4096}), 4096) == 2048
    assert attended_keys_per_query(dense.model_copy(update={"sliding_window": 9999}), 4096) == 2048
    half = dense.model_copy(update={"sliding_window": 128, "sliding_window_layers": 2})
    assert attended_keys_per_query(half, 4096) == (2048 + 126) / 2
    assert attended_keys_per_query(half, 4096, causal=False) == (4096 + 128) / 2
    # Fused attention work and model FLOPs follow; the projections do not change.
    job = Job(seq_len=4096, global_batch_size=1)
    full_work = layer_work(dense, job, Layout(), False)
    half_work = layer_work(half, job, Layout(), False)
    assert half_work.attention_flops / full_work.attention_flops == pytest.approx(1087 / 2048)
    assert half_work.gemms == full_work.gemms
    saved = 4 * 8 * 128 * (4096 - 128) * 2  # two windowed layers, non-causal convention
    assert (forward_flops_per_token(dense, 4096) - forward_flops_per_token(half, 4096)
            == pytest.approx(saved))


def test_sliding_window_fields_are_validated() -> None:
    from pydantic import ValidationError

    base = dict(name="d", num_layers=4, hidden_size=1024, num_attention_heads=8,
                ffn_hidden_size=4096, vocab_size=1000)
    with pytest.raises(ValidationError, match="sliding_window_layers 5 exceeds num_layers 4"):
        Model(**base, sliding_window=128, sliding_window_layers=5)
    with pytest.raises(ValidationError, match="sliding_window is not"):
        Model(**base, sliding_window_layers=2)
    assert Model(**base, sliding_window_layers=0).num_sliding_window_layers == 0
    assert Model(**base, sliding_window=64).num_sliding_window_layers == 4


def test_ring_attention_chunks_lower_the_attention_kernel_throughput() -> None:
    """Fused attention reaches keys/(keys + half) of its peak: CP's 1/cp key chunks per kernel
    call run the same FLOPs per GPU slower than one call over all keys (hand calculation)."""
    model = model_preset("llama3-8b")
    calib = calibration_for(cluster_preset("dgx-h100"))
    job = Job(seq_len=32768, global_batch_size=8)
    one = layer_work(model, job, Layout(dp=8), False)
    ring = layer_work(model, Job(seq_len=65536, global_batch_size=8), Layout(dp=4, cp=2), False)
    assert one.attention_keys == pytest.approx(32768 / 2)  # causal: half the keys on average
    assert ring.attention_keys == pytest.approx(65536 / 2 / 2)
    half = calib.attention_half_keys
    assert half > 0
    per_flop = {}
    for name, work in (("one", one), ("ring", ring)):
        fused = pass_times(work, calib, "bf16", "none")
        bare = pass_times(replace(work, attention_flops=0.0), calib, "bf16", "none")
        per_flop[name] = (fused.forward_s - bare.forward_s) / work.attention_flops
    keys = (one.attention_keys, ring.attention_keys)
    expected = (keys[0] / (keys[0] + half)) / (keys[1] / (keys[1] + half))
    # The GEMM curve's fixed per-kernel time is a small correction at these sizes.
    assert per_flop["ring"] / per_flop["one"] == pytest.approx(expected, rel=0.01)


def test_head_dim_64_attention_runs_at_cudnns_measured_ratio() -> None:
    """cuDNN 9.27's own forward measurements (NVIDIA/cudnn-frontend attention_inference results,
    64/8 heads, causal, BF16): head dimension 64 at 0.69-0.71 of 128's TFLOP/s on H200 and
    GB200; MLA's 192 at 128's. A d 64 layer's fused attention takes 1/0.70 the time per FLOP
    of a d 128 layer, the rest of the layer unchanged."""
    from placer.cost.compute import head_dim_efficiency

    measured = {"H200": ((348.169, 490.416), (457.451, 653.556)),
                "GB200": ((667.711, 955.765), (994.722, 1438.125))}
    for pairs in measured.values():
        for d64, d128 in pairs:
            assert head_dim_efficiency(64) == pytest.approx(d64 / d128, abs=0.015)
    assert head_dim_efficiency(128) == 1.0
    assert head_dim_efficiency(192) == 1.0  # dsv3 1,350 against llama3.1 1,335 TFLOP/s
    assert head_dim_efficiency(32) == head_dim_efficiency(64)  # held below the measurements
    assert 0.70 < head_dim_efficiency(96) < 1.0
    assert head_dim_efficiency(96) == pytest.approx(0.70 + 0.30 * 0.5849625, rel=1e-6)  # log2 1.5

    calib = calibration_for(cluster_preset("dgx-h100"))
    job = Job(seq_len=4096, global_batch_size=8)
    wide = Model(name="w", num_layers=4, hidden_size=4096, num_attention_heads=32,
                 ffn_hidden_size=11008, vocab_size=32000)  # d 128
    narrow = wide.model_copy(update={"num_attention_heads": 64})  # d 64, the same width
    times = {}
    for name, model in (("wide", wide), ("narrow", narrow)):
        work = layer_work(model, job, Layout(dp=8), False)
        assert work.attention_head_dim == model.attention_head_dim
        fused = pass_times(work, calib, "bf16", "none")
        bare = pass_times(replace(work, attention_flops=0.0), calib, "bf16", "none")
        times[name] = (fused.forward_s - bare.forward_s) / work.attention_flops
    assert times["narrow"] / times["wide"] == pytest.approx(1 / 0.70, rel=0.02)


def test_wave_quantization_by_hand_on_a100s_108_sms() -> None:
    from placer.cost.compute import wave_efficiency

    # 109 output tiles of 128x128 need two waves on 108 SMs; the second runs one tile as long
    # as a full wave (NVIDIA, "Matrix Multiplication Background"): 109 / 216 useful. The
    # 256x128 tiling gives 55 tiles in one wave of 108 slots: 109 x 128 x 128 / (108 x 256 x 128)
    # is the same 109/216.
    assert wave_efficiency(109 * 128, 128, 256, 108) == pytest.approx(109 / 216)
    # 1024 x 1024 output: 64 tiles of 128x128 fill 64/108; 32 tiles of 256x128 split K=4096
    # three ways (108 // 32 = 3, 4096 // 512 = 8) fill 96 of 108 slots.
    assert wave_efficiency(1024, 1024, 4096, 108) == pytest.approx(96 / 108)
    # Whole waves of whole tiles waste nothing.
    assert wave_efficiency(256 * 132, 128, 8192, 132) == pytest.approx(1.0)


def test_gemm_times_use_the_shape_the_mamf_ceiling_and_the_hbm_roofline() -> None:
    from placer.cost.compute import gemm_times
    from placer.cost.profile import MAMF_EFFICIENCY

    calib = replace(calibration_for(cluster_preset("dgx-h100")), gemm_sustained_fraction=1.0)
    fixed = calib.half_efficiency_flops("bf16") / (calib.peak_bf16_flops * MAMF_EFFICIENCY[
        "H100"][0])
    # A large aligned GEMM (whole waves) runs at the MAMF rate: 794.5 TFLOP/s [ml-engineering].
    m, n, k = 256.0 * 132, 4096.0, 8192.0
    (t,) = gemm_times(((2 * m * n * k, 3),), ((m, n, k),), calib, "bf16")
    assert t == pytest.approx(3 * (2 * m * n * k / 794.5e12 + fixed), rel=1e-3)
    # A skinny GEMM is memory bound: 16 rows against an 8192 x 8192 weight reads 128 MiB.
    m, n, k = 16.0, 8192.0, 8192.0
    (t,) = gemm_times(((2 * m * n * k, 1),), ((m, n, k),), calib, "bf16")
    moved = 2 * (m * k + k * n) + 2 * m * n
    assert t == pytest.approx(moved / (3.35e12 * HBM_EFFICIENCY) + fixed, rel=1e-3)


def test_mxfp8_gemms_take_transformer_engines_measured_time_over_fp8() -> None:
    from placer.cost.compute import gemm_times, linear_precision
    from placer.cost.stack_options import options_for

    # Transformer Engine's pre-quantised B300 benchmark (gemm_profiling.rst): a layer's 12 GEMMs
    # take 7.161 ms in MXFP8 against 6.812 ms in per-tensor-scaled FP8.
    calib = replace(calibration_for(cluster_preset("dgx-b200")), gemm_sustained_fraction=1.0)
    fixed = calib.half_efficiency_flops("fp8") / (calib.peak_flops("fp8")
                                                  * calib.gemm_efficiency("fp8"))
    m, n, k = 256.0 * 148, 8192.0, 8192.0  # whole waves on 148 SMs: compute bound
    flops = 2 * m * n * k
    (t_mx,) = gemm_times(((flops, 1),), ((m, n, k),), calib, "mxfp8")
    (t8,) = gemm_times(((flops, 1),), ((m, n, k),), calib, "fp8")
    assert (t_mx - fixed) / (t8 - fixed) == pytest.approx(7.161 / 6.812, rel=1e-6)
    # Memory bound: an E4M3 byte plus an E8M0 scale per 32 elements.
    m = 16.0
    (t_mx,) = gemm_times(((2 * m * n * k, 1),), ((m, n, k),), calib, "mxfp8")
    moved = (1 + 1 / 32) * (m * k + k * n) + 2 * m * n
    assert t_mx == pytest.approx(moved / (calib.hbm_bytes_per_s * HBM_EFFICIENCY) + fixed,
                                 rel=1e-6)
    # The job's runtime names the recipe; a BF16 job's GEMMs stay BF16.
    job = Job.model_validate({"global_batch_size": 8, "seq_len": 4096, "precision": "fp8",
                              "runtime": {"fp8_recipe": "mxfp8"}})
    assert linear_precision(job, options_for(job, None)) == "mxfp8"
    assert linear_precision(job.model_copy(update={"precision": "bf16"}),
                            CostOptions(mxfp8_gemms=True)) == "bf16"


def test_nvfp4_gemms_run_at_blackwells_fp4_peak_and_move_half_bytes() -> None:
    from placer.cost.compute import gemm_times

    # GB200: dense FP4 10 PFLOP/s against FP8's 5 (NVIDIA's figures, docs/sources.md 5.3).
    calib = replace(calibration_for(cluster_preset("gb200-nvl72")), gemm_sustained_fraction=1.0)
    assert calib.peak_flops("fp4") == pytest.approx(2 * calib.peak_flops("fp8"))
    fixed = calib.half_efficiency_flops("fp8") / (calib.peak_flops("fp8")
                                                  * calib.gemm_efficiency("fp8"))
    m, n, k = 256.0 * 148, 8192.0, 8192.0  # whole waves on 148 SMs: compute bound
    flops = 2 * m * n * k
    (t4,) = gemm_times(((flops, 1),), ((m, n, k),), calib, "fp4")
    (t8,) = gemm_times(((flops, 1),), ((m, n, k),), calib, "fp8")
    assert t4 - fixed == pytest.approx((t8 - fixed) / 2, rel=1e-6)
    # Memory bound: 4-bit values plus an E4M3 scale per 16 (0.5625 B) against FP8's 1 B.
    m = 16.0
    (t4,) = gemm_times(((2 * m * n * k, 1),), ((m, n, k),), calib, "fp4")
    moved = 0.5625 * (m * k + k * n) + 2 * m * n
    assert t4 == pytest.approx(moved / (calib.hbm_bytes_per_s * HBM_EFFICIENCY) + fixed, rel=1e-6)
    # Hopper has no FP4 tensor cores: an NVFP4 recipe's GEMMs cost what FP8's do.
    hopper = calibration_for(cluster_preset("dgx-h100"))
    assert hopper.peak_flops("fp4") == hopper.peak_flops("fp8")
    assert gemm_times(((flops, 1),), ((m, n, k),), hopper, "fp4") == gemm_times(
        ((flops, 1),), ((m, n, k),), hopper, "fp8")


def test_attention_kernels_scale_fused_attention_time_and_nothing_else() -> None:
    """FlashAttention-2 runs at 35 / 75 of cuDNN's share of H100's peak (FlashAttention-3's
    paper, arXiv:2407.08608, section 1), FlashAttention in Triton at ``triton_fa_relative`` of
    FlashAttention-2's, forward and backward alike; before Hopper FlashAttention-2 is the fitted
    kernel itself. Only the fused-attention part of a layer's time moves."""
    from placer.cost.compute import FA2_RELATIVE_THROUGHPUT

    assert pytest.approx(0.35 / 0.75) == FA2_RELATIVE_THROUGHPUT
    job = Job(seq_len=8192, global_batch_size=8)
    model = Model(name="m", num_layers=4, hidden_size=4096, num_attention_heads=32,
                  ffn_hidden_size=11008, vocab_size=32000)
    for cluster, fa2_share in (("dgx-h100", FA2_RELATIVE_THROUGHPUT), ("dgx-a100", 1.0)):
        calib = replace(calibration_for(cluster_preset(cluster)), triton_fa_relative=0.5)
        attention = {}
        for kernel in ("cudnn", "fa2", "fa_triton"):
            work = layer_work(model, job, Layout(dp=8), False,
                              CostOptions(attention_kernel=kernel))
            fused = pass_times(work, calib, "bf16", "none")
            bare = pass_times(replace(work, attention_flops=0.0), calib, "bf16", "none")
            attention[kernel] = (fused.forward_s - bare.forward_s,
                                 fused.backward_s - bare.backward_s)
            assert bare.forward_s == pytest.approx(
                pass_times(replace(layer_work(model, job, Layout(dp=8), False),
                                   attention_flops=0.0), calib, "bf16", "none").forward_s)
        for pass_index in (0, 1):
            cudnn, fa2, triton = (attention[k][pass_index] for k in ("cudnn", "fa2", "fa_triton"))
            assert cudnn / fa2 == pytest.approx(fa2_share, rel=0.02)
            assert fa2 / triton == pytest.approx(0.5, rel=0.02)
