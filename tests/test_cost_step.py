"""Step time composed from the parts: bubble, breakdown, overlaps, placements, every preset."""

from __future__ import annotations

import pytest

from placer.cost import estimate
from placer.cost.options import CostOptions
from placer.dims import DEFAULT_ORDER, Group, Part
from placer.spec import Job, Layout, Model
from placer.spec.presets import cluster_names, cluster_preset, model_preset
from placer.spec.results import Estimate

# A model whose ends are negligible, so every pipeline stage costs the same.
UNIFORM = Model(name="uniform", num_layers=16, hidden_size=4096, num_attention_heads=32,
                ffn_hidden_size=16384, gated_mlp=False, vocab_size=8, tied_embeddings=True)


def parts_sum(est: Estimate) -> float:
    return sum(est.breakdown.model_dump().values())


def stage_time(est: Estimate, m: int) -> float:
    b = est.breakdown
    return (b.compute_s + b.recompute_s + b.tp_exposed_s + b.cp_exposed_s + b.ep_exposed_s
            + b.zero_exposed_s) / m


@pytest.mark.parametrize(("vpp", "m"), [(1, 8), (1, 32), (2, 8)])
def test_pipeline_bubble_is_p_minus_1_over_v_m(vpp: int, m: int) -> None:
    cluster = cluster_preset("dgx-h100")
    layout = Layout(pp=4, dp=2, vpp=vpp, micro_batch_size=1)
    job = Job(seq_len=2048, global_batch_size=2 * m)
    est = estimate(UNIFORM, cluster, job, layout)
    fraction = est.breakdown.pp_bubble_s / (m * stage_time(est, m))
    # The last stage also runs the (tiny) output layer, so stages differ by well under 1 %.
    assert fraction == pytest.approx(3 / (vpp * m), rel=1e-2)


def test_breakdown_adds_up_and_throughput_follows() -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(4)
    job = Job(seq_len=4096, global_batch_size=64)
    est = estimate(model_preset("llama3-70b"), cluster, job,
                   Layout(tp=8, pp=2, dp=2, zero_stage=1, recompute="selective",
                          sequence_parallel=True))
    assert est.step_time_s == pytest.approx(parts_sum(est))
    assert est.tokens_per_s == pytest.approx(64 * 4096 / est.step_time_s)
    assert est.mfu == pytest.approx(est.tflops_per_gpu * 1e12 / 989.4e12)
    assert est.hardware_tflops_per_gpu > est.tflops_per_gpu
    assert est.breakdown.tp_exposed_s > 0 and est.breakdown.pp_bubble_s > 0
    assert {c.dimension for c in est.collectives} >= {"tp", "pp", "dp"}
    assert est.links == {"tp": "nvlink", "pp": "network", "dp": "network"}


def test_one_gpu_has_no_communication() -> None:
    cluster = cluster_preset("dgx-h100")
    est = estimate(model_preset("llama2-7b"), cluster, Job(seq_len=2048, global_batch_size=4),
                   Layout(micro_batch_size=1))
    b = est.breakdown
    assert b.tp_exposed_s == b.dp_exposed_s == b.pp_bubble_s == b.pp_p2p_s == 0.0
    assert est.collectives == [] and est.links == {}
    assert est.step_time_s == pytest.approx(b.compute_s + b.optimizer_s)


def test_tp_across_nodes_costs_more_than_tp_inside_a_node() -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    job = Job(seq_len=4096, global_batch_size=16)
    layout = Layout(tp=2, dp=8, sequence_parallel=True)
    model = model_preset("llama3-8b")
    inside = estimate(model, cluster, job, layout)
    # dp innermost: the two TP ranks land 8 slots apart, on different nodes.
    across = estimate(model, cluster, job, layout, order=("dp", "tp", "cp", "pp"))
    assert across.links["tp"] == "network" and inside.links["tp"] == "nvlink"
    assert across.breakdown.tp_exposed_s > 5 * inside.breakdown.tp_exposed_s
    # The same through an explicit placement: swap the roles of the two nodes' halves.
    swapped = [(i % 2) * 8 + i // 2 for i in range(16)]
    placed = estimate(model, cluster, job, layout, order=DEFAULT_ORDER, placement=swapped)
    assert placed.links["tp"] == "network"


def test_overlap_options_change_only_what_they_overlap() -> None:
    cluster = cluster_preset("dgx-a100").with_nodes(4)
    job = Job(seq_len=2048, global_batch_size=32)
    layout = Layout(tp=8, dp=4, micro_batch_size=1)
    model = model_preset("gpt-7.5b")
    base = estimate(model, cluster, job, layout)
    no_dp_overlap = estimate(model, cluster, job, layout,
                             options=CostOptions(dp_comm_overlap=False))
    # TP overlap pipelines the sequence-parallel all-gather/reduce-scatter with the GEMMs
    # (Megatron refuses --tp-comm-overlap without --sequence-parallel): an all-reduce stays.
    tp_overlap = estimate(model, cluster, job, layout, options=CostOptions(tp_comm_overlap=True))
    sp = layout.model_copy(update={"sequence_parallel": True})
    sp_base = estimate(model, cluster, job, sp)
    sp_overlap = estimate(model, cluster, job, sp, options=CostOptions(tp_comm_overlap=True))
    unfused = estimate(model, cluster, job, layout, options=CostOptions(flash_attention=False))
    assert no_dp_overlap.breakdown.dp_exposed_s > base.breakdown.dp_exposed_s
    assert no_dp_overlap.breakdown.compute_s == base.breakdown.compute_s
    assert tp_overlap.breakdown.tp_exposed_s == base.breakdown.tp_exposed_s
    assert sp_overlap.breakdown.tp_exposed_s < sp_base.breakdown.tp_exposed_s
    assert sp_overlap.breakdown.compute_s == sp_base.breakdown.compute_s
    assert unfused.step_time_s > base.step_time_s


def test_zero3_gathers_per_micro_batch_and_context_parallel_exchanges_kv() -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(4)
    model = model_preset("llama3-8b")
    z3 = estimate(model, cluster, Job(seq_len=4096, global_batch_size=64),
                  Layout(dp=32, zero_stage=3, micro_batch_size=1, recompute="full"))
    kinds = {(c.dimension, c.collective): c for c in z3.collectives}
    # FSDP units: the recomputed forward runs inside the unit's backward, after its pre-backward
    # all-gather, so fwd + bwd per micro-batch (m = 2); DeepSpeed's per-submodule fetches
    # gather again for the recomputation.
    assert kinds[("zero", "all_gather")].calls_per_step == 2 * 2
    assert kinds[("zero", "reduce_scatter")].calls_per_step == 2
    ds = estimate(model, cluster, Job(seq_len=4096, global_batch_size=64),
                  Layout(dp=32, zero_stage=3, micro_batch_size=1, recompute="full"),
                  options=CostOptions(zero3_max_live_params=1e9))
    ds_kinds = {(c.dimension, c.collective): c for c in ds.collectives}
    assert ds_kinds[("zero", "all_gather")].calls_per_step == 3 * 2  # fwd, recompute, bwd
    cp = estimate(model, cluster, Job(seq_len=65536, global_batch_size=8),
                  Layout(cp=8, dp=4, zero_stage=1, recompute="full"))
    rows = {(c.dimension, c.collective): c for c in cp.collectives}
    assert rows[("cp", "send_recv")].group_size == 8
    assert cp.breakdown.cp_exposed_s < rows[("cp", "send_recv")].time_s


def test_fsdp_gathers_cross_nodes_at_the_nodes_nics_deepspeed_fetches_at_one_gpus() -> None:
    # 4 DGX H100 nodes, dp=32: a ring with a channel per NIC moves FSDP's flat-buffer traffic
    # through all 8 NICs of a node (8 x 50 GB/s x 0.94 = 376 GB/s, then NVLink's 367.5 GB/s
    # busbw bounds the ring); DeepSpeed's per-submodule fetches get one NIC's 47 GB/s.
    cluster = cluster_preset("dgx-h100").with_nodes(4)
    model = model_preset("llama3-8b")
    job = Job(seq_len=4096, global_batch_size=64)
    layout = Layout(dp=32, zero_stage=3, micro_batch_size=1)
    rows = {}
    for name, options in (("fsdp", CostOptions()),
                          ("deepspeed", CostOptions(zero3_max_live_params=1e9))):
        est = estimate(model, cluster, job, layout, options=options)
        rows[name] = next(c for c in est.collectives
                          if c.dimension == "zero" and c.collective == "all_gather")
    for name, busbw in (("fsdp", 367.5e9), ("deepspeed", 47e9)):
        row = rows[name]
        moved = 31 / 32 * row.message_bytes * row.calls_per_step
        assert row.time_s == pytest.approx(moved / busbw, rel=0.02)


def test_moe_all_to_all_and_load_imbalance() -> None:
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    model = model_preset("mixtral-8x7b")
    job = Job(seq_len=4096, global_batch_size=32)
    layout = Layout(tp=2, dp=8, ep=8, zero_stage=1, sequence_parallel=True,
                    recompute="selective")
    balanced = estimate(model, cluster, job, layout, options=CostOptions(moe_load_imbalance=1.0))
    skewed = estimate(model, cluster, job, layout, options=CostOptions(moe_load_imbalance=1.5))
    assert any(c.dimension == "ep" and c.collective == "all_to_all" for c in balanced.collectives)
    assert skewed.breakdown.ep_exposed_s == pytest.approx(1.5 * balanced.breakdown.ep_exposed_s,
                                                          rel=0.05)
    assert skewed.step_time_s > balanced.step_time_s
    assert skewed.peak_memory_bytes > balanced.peak_memory_bytes


@pytest.mark.parametrize("name", cluster_names())
def test_every_cluster_preset_estimates_dense_and_moe(name: str) -> None:
    cluster = cluster_preset(name)
    gpus = cluster.num_gpus
    dense = estimate(model_preset("llama3-8b"), cluster, Job(seq_len=4096, global_batch_size=gpus),
                     Layout(dp=gpus, zero_stage=1, recompute="selective"))
    moe = estimate(model_preset("mixtral-8x7b"), cluster,
                   Job(seq_len=4096, global_batch_size=gpus, precision="fp8"),
                   Layout(tp=2, dp=gpus // 2, ep=gpus // 2 if gpus // 2 <= 8 else 8,
                          zero_stage=1, recompute="full", sequence_parallel=True))
    for est in (dense, moe):
        assert 0 < est.mfu < 1 and est.step_time_s == pytest.approx(parts_sum(est))


def test_same_inputs_give_the_same_json() -> None:
    cluster = cluster_preset("dgx-b200").with_nodes(2)
    job = Job(seq_len=4096, global_batch_size=32, precision="fp8")
    layout = Layout(tp=4, pp=2, dp=2, zero_stage=1, sequence_parallel=True)
    first = estimate(model_preset("llama3-70b"), cluster, job, layout).model_dump_json()
    second = estimate(model_preset("llama3-70b"), cluster, job, layout).model_dump_json()
    assert first == second


def test_more_gpus_than_the_cluster_is_a_user_error() -> None:
    from placer.errors import InputError

    with pytest.raises(InputError, match="needs 16 GPUs"):
        estimate(model_preset("llama3-8b"), cluster_preset("dgx-h100"),
                 Job(seq_len=4096, global_batch_size=16), Layout(dp=16))


@pytest.mark.parametrize("order", [("tp", "cp", "dp", "pp"), ("dp", "tp", "cp", "pp"),
                                   ("cp", "dp", "tp", "pp")])
@pytest.mark.parametrize("text", ["tp=2,cp=2,dp=4,pp=2,ep=4", "tp=2,dp=8,ep=4,etp=2",
                                  "tp=4,dp=4,ep=2", "tp=2,cp=2,dp=16,pp=2,ep=16,etp=2",
                                  "tp=8,cp=2,dp=8,ep=64,etp=1"])
def test_representative_groups_match_the_mesh_without_enumerating(order: tuple[str, ...],
                                                                  text: str) -> None:
    from placer.cost.groups import representative_groups
    from placer.mesh import MeshGrid

    layout = Layout.parse(text)
    grid = MeshGrid(layout, order)
    groups = representative_groups(layout, order)
    for dim in ("tp", "cp", "pp", "ep", "etp", "edp"):
        if dim in groups:
            assert groups[dim] == grid.groups(dim)[0], dim
    assert groups[Group.DP_CP] == grid.groups("dp_cp")[0]


def test_moe_all_to_all_moves_top_k_copies_forward_and_backward() -> None:
    cluster = cluster_preset("dgx-h100")
    model = model_preset("qwen3-30b-a3b")  # top-8 of 128 experts, hidden 2048
    job = Job(seq_len=4096, global_batch_size=8)
    balanced = CostOptions(moe_load_imbalance=1.0)
    rows = {}
    for recompute in ("none", "full"):
        est = estimate(model, cluster, job, Layout(dp=8, ep=8, zero_stage=1, recompute=recompute),
                       options=balanced)
        rows[recompute] = next(c for c in est.collectives if c.dimension == "ep")
    # Dispatch and combine, forward and backward (and the recomputed forward), per MoE layer
    # and micro-batch; each sends every token's top-k copies of h bf16 activations.
    assert rows["none"].message_bytes == 4096 * 8 * 2048 * 2
    assert rows["none"].calls_per_step == 4 * 48
    assert rows["full"].calls_per_step == 6 * 48


def test_fp8_speeds_up_the_layers_but_not_the_output_layer() -> None:
    # FP8 recipes leave the output layer in BF16, so FP8 saves exactly the layers' GEMM time.
    from placer.cost.compute import layer_work, pass_times
    from placer.cost.profile import calibration_for

    cluster = cluster_preset("dgx-h100")
    model = Model(name="big-vocab", num_layers=2, hidden_size=4096, num_attention_heads=32,
                  ffn_hidden_size=16384, vocab_size=256000)
    layout = Layout(micro_batch_size=1)
    calib = calibration_for(cluster)
    compute = {}
    layers = {}
    for precision in ("bf16", "fp8"):
        job = Job(seq_len=2048, global_batch_size=4, precision=precision)
        compute[precision] = estimate(model, cluster, job, layout).breakdown.compute_s
        work = layer_work(model, job, layout, False)
        layers[precision] = pass_times(work, calib, precision, "none").total_s
    saved = 4 * 2 * (layers["bf16"] - layers["fp8"])  # 4 micro-batches of 2 layers
    assert saved > 0
    assert compute["bf16"] - compute["fp8"] == pytest.approx(saved, rel=1e-9)


def test_the_worst_placed_group_can_be_priced_instead_of_the_first() -> None:
    # CP groups of 4 on two 8-GPU nodes: group 0 sits on node 0, group 1 straddles both nodes.
    from placer.cost.groups import representative_groups, worst_placed_groups

    cluster = cluster_preset("dgx-h100").with_nodes(2)
    layout = Layout(cp=4, dp=2, micro_batch_size=1)
    order = ("tp", "cp", "dp", "pp")
    slots = [0, 1, 2, 3, 6, 7, 8, 9]
    worst = worst_placed_groups(cluster, layout, order, slots)
    first = representative_groups(layout, order)
    assert first["cp"] == [0, 1, 2, 3] and worst["cp"] == [4, 5, 6, 7]
    assert worst[Group.DP_CP] == first[Group.DP_CP]  # every dp x cp group is the same 8 ranks
    job = Job(seq_len=8192, global_batch_size=8)
    model = model_preset("llama3-8b")
    as_first = estimate(model, cluster, job, layout, order, placement=slots)
    as_worst = estimate(model, cluster, job, layout, order, placement=slots, groups=worst)
    assert as_first.links["cp"] == "nvlink" and as_worst.links["cp"] == "network"
    assert as_worst.breakdown.cp_exposed_s > as_first.breakdown.cp_exposed_s
    aligned = worst_placed_groups(cluster, layout, order, [0, 1, 2, 3, 8, 9, 10, 11])
    assert aligned == first


def test_dense_and_expert_gradient_reductions_are_separate_rows() -> None:
    # Mixtral 8x7B on 16 GPUs, tp=2, dp=8, ep=4 (etp=1), no ZeRO: dense gradients all-reduce
    # over dp x cp = 8 ranks, expert gradients over the expert data-parallel group
    # tp*cp*dp / (ep*etp) = 4 ranks. One row each, never merged.
    model = model_preset("mixtral-8x7b")
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    layout = Layout.parse("tp=2,dp=8,ep=4,zero=0")
    est = estimate(model, cluster, Job(seq_len=4096, global_batch_size=512), layout)
    rows = {c.group: c for c in est.collectives if c.dimension == Part.DP}
    assert set(rows) == {Group.DP_CP, Group.EDP}
    dense, expert = rows[Group.DP_CP], rows[Group.EDP]
    assert (dense.group_size, expert.group_size) == (8, 4)
    assert dense.collective == expert.collective == "all_reduce"
    assert dense.calls_per_step == expert.calls_per_step == 1
    # Hand count from Mixtral's config.json (hidden 4096, 32 heads, 8 KV heads of 128, expert
    # FFN 14336, vocab 32000, 32 layers, 8 experts), fp32 gradients (4 bytes each).
    h, layers, vocab, ffn = 4096, 32, 32000, 14336
    experts_per_rank = 8 // 4
    assert expert.message_bytes == experts_per_rank * 3 * h * ffn * layers * 4
    attention = 2 * h * h + 2 * h * 8 * 128
    dense_params = (layers * attention + 2 * vocab * h) / layout.tp  # untied embedding and head
    assert dense.message_bytes == pytest.approx(dense_params * 4, rel=5e-3)
    assert est.collectives == sorted(est.collectives, key=lambda c: (
        [Part.TP, Part.CP, Part.EP, Part.PP, Part.DP, Part.ZERO].index(c.dimension),
        c.group != Group.DP_CP))


def _exposed(comm_s: float, window_s: float, efficiency: float) -> float:
    """Hand rule: what exceeds the window, and never less than (1 - efficiency) of it."""
    return max(comm_s - window_s, comm_s * (1 - efficiency), 0.0)


def test_zero2_reduce_scatter_hides_behind_the_next_chunk_under_interleaving() -> None:
    # 16 uniform layers on pp=2 with vpp=8: one-layer chunks (the Llama 3 paper's layout).
    # Each layer's gradient reduce-scatter (FSDP2: one in flight) runs behind what the rank
    # computes before the next layer's reduce-scatter is issued: the next forward chunk and
    # backward chunk, 1/8 of the micro-batch's F + B. Over the 8 layers that is
    # exposed(rs, F + B) per micro-batch; the step's very last reduce-scatter has nothing behind
    # it: rs/8 in full instead of exposed(rs/8, (F + B)/8).
    from placer.cost.profile import calibration_for

    cluster = cluster_preset("dgx-h100").with_nodes(4)
    m = 8
    est = estimate(UNIFORM, cluster, Job(seq_len=4096, global_batch_size=16 * m),
                   Layout(pp=2, vpp=8, dp=16, zero_stage=2, micro_batch_size=1))
    efficiency = calibration_for(cluster).zero_overlap_efficiency
    row = next(c for c in est.collectives if c.dimension == Part.ZERO)
    assert (row.collective, row.calls_per_step) == ("reduce_scatter", m)
    rs = row.time_s / m
    slot = est.breakdown.compute_s / m  # F + B of the (worst) stage, no recomputation
    layers = 8
    expected = (m * _exposed(rs, slot, efficiency)
                + rs / layers - _exposed(rs / layers, slot / layers, efficiency))
    assert est.breakdown.zero_exposed_s == pytest.approx(expected, rel=1e-3)
    assert row.exposed_s == pytest.approx(expected, rel=1e-3)


def test_each_overlap_mechanism_has_its_own_efficiency() -> None:
    # TP collectives pipelined with their GEMMs use tp_overlap_efficiency only: at 0 nothing is
    # hidden, so the exposed TP time is the plain TP traffic; ZeRO traffic per micro-batch uses
    # zero_overlap_efficiency only.
    from dataclasses import replace

    from placer.cost.groups import group_links
    from placer.cost.profile import calibration_for
    from placer.cost.step import estimate_with

    cluster = cluster_preset("dgx-h100").with_nodes(2)
    model = model_preset("llama3-8b")
    job = Job(seq_len=4096, global_batch_size=32)
    layout = Layout(tp=4, dp=4, zero_stage=3, micro_batch_size=1, sequence_parallel=True)
    links = group_links(cluster, layout, DEFAULT_ORDER, None)
    calib = calibration_for(cluster)

    def run(options: CostOptions, **constants: float) -> Estimate:
        return estimate_with(model, cluster, job, layout, DEFAULT_ORDER, links,
                             replace(calib, **constants), options)

    overlapped, plain = CostOptions(tp_comm_overlap=True), CostOptions()
    none = run(overlapped, tp_overlap_efficiency=0.0)
    assert none.breakdown.tp_exposed_s == pytest.approx(run(plain).breakdown.tp_exposed_s)
    assert run(overlapped, tp_overlap_efficiency=0.9).breakdown.tp_exposed_s < (
        none.breakdown.tp_exposed_s)
    # The shared constant leaves both alone; each mechanism's moves only its own part.
    other = run(overlapped, tp_overlap_efficiency=0.0, overlap_efficiency=0.0)
    assert other.breakdown.tp_exposed_s == none.breakdown.tp_exposed_s
    assert other.breakdown.zero_exposed_s == none.breakdown.zero_exposed_s
    zero = run(overlapped, tp_overlap_efficiency=0.0, zero_overlap_efficiency=0.0)
    assert zero.breakdown.zero_exposed_s > none.breakdown.zero_exposed_s
    assert zero.breakdown.tp_exposed_s == none.breakdown.tp_exposed_s
