"""Pipeline schedules, uneven splits, dispatchers, HSDP and recompute modules, each pinned
against a hand calculation from the published formula (sources in the modules' docstrings)."""

from __future__ import annotations

import math

import pytest

from placer.cost import estimate
from placer.cost.collectives import DEEPEP_RDMA_EFFICIENCY
from placer.cost.dispatch import dispatch_message, expected_ranks, rdma_message
from placer.cost.memory import activation_bytes_per_token
from placer.cost.options import CostOptions
from placer.cost.pipeline import bubble_s, microbatches_in_flight, parameter_copies
from placer.cost.recompute import recomputed_fraction
from placer.spec import Job
from placer.spec.layout import Layout
from placer.spec.pipeline import parse_megatron_layout, resolve_split
from placer.spec.presets import cluster_preset, model_preset


# p = 4 ranks, v = 2, per micro-batch F = 1, B = 2 (input + weight gradients), W = 1.
@pytest.mark.parametrize(("schedule", "vpp", "bubble"), [
    ("gpipe", 1, 3 * (1 + 2)),  # (p-1)(F+B)
    ("1f1b", 1, 3 * (1 + 2)),
    ("interleaved", 2, 3 * (1 + 2) / 2),  # (p-1)(F+B)/v
    ("zb1p", 1, 3 * (1 + 2 - 2 * 1)),  # DeepSeek-V3 Table 2: (PP-1)(F+B-2W)
    ("zbv", 2, 3 * (1 + 2 - 3 * 1) / 2),  # ZB-V: zero when F = B_input = W
    ("dualpipev", 2, 3 * ((1 + 2) + 2 - 3 * 1) / 2),  # (PP/2-1)(F&B+B-3W), PP = 2p chunks
    ("dualpipe", 1, (4 / 2 - 1) * ((1 + 2) + 2 - 3 * 1)),  # (PP/2-1)(F&B+B-3W)
])
def test_bubble_matches_the_published_formula(schedule: str, vpp: int, bubble: float) -> None:
    assert bubble_s(schedule, 4, vpp, 1.0, 2.0, 1.0) == pytest.approx(bubble)


def test_zero_bubble_gain_grows_with_the_weight_gradient_share() -> None:
    assert bubble_s("zb1p", 8, 1, 1.0, 2.0, 0.0) == bubble_s("1f1b", 8, 1, 1.0, 2.0, 0.0)
    assert bubble_s("zbv", 8, 2, 1.0, 2.0, 1.5) == 0.0  # never negative
    assert bubble_s("1f1b", 1, 1, 1.0, 2.0, 1.0) == 0.0


@pytest.mark.parametrize(("text", "stage", "m", "held"), [
    ("pp=4,dp=1,schedule=gpipe", 0, 16, 16.0),  # every micro-batch before the first backward
    ("pp=4,dp=1", 0, 16, 4.0),  # 1F1B: p - r
    ("pp=4,dp=1", 3, 16, 1.0),
    ("pp=4,dp=1,schedule=zb1p", 1, 16, 3.0),  # ZB-H1 keeps 1F1B's peak
    ("pp=4,vpp=2,dp=1", 0, 16, 4 * (1 + 3 / 8)),  # Megatron: p (1 + (p-1)/(p v))
    ("pp=4,vpp=2,dp=1,schedule=zbv", 2, 16, 4.0),  # ZB-V: p on every rank
    ("pp=4,vpp=2,dp=1,schedule=dualpipev", 0, 16, 4.5),  # 2p+1 half-rank chunks
    ("pp=4,dp=1,schedule=dualpipe", 0, 16, 5.0),  # PP + 1
    ("pp=4,dp=1,schedule=dualpipe", 0, 3, 3.0),  # never more than the micro-batches
])
def test_micro_batches_in_flight(text: str, stage: int, m: int, held: float) -> None:
    assert microbatches_in_flight(Layout.parse(text), stage, m) == pytest.approx(held)


def test_dualpipe_keeps_two_parameter_copies() -> None:
    assert parameter_copies(Layout.parse("pp=4,schedule=dualpipe")) == 2
    assert parameter_copies(Layout.parse("pp=4,vpp=2,schedule=dualpipev")) == 1


def test_estimate_prices_each_schedule_by_its_bubble() -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(1)
    job = Job(seq_len=4096, global_batch_size=32)
    base = "tp=1,pp=8,vpp=2,dp=1,mbs=1"
    bubbles = {s: estimate(model, cluster, job, Layout.parse(f"{base},schedule={s}")
                           ).breakdown.pp_bubble_s for s in ("interleaved", "zb1p", "zbv")}
    assert bubbles["zbv"] < bubbles["zb1p"] < bubbles["interleaved"]
    plain = estimate(model, cluster, job, Layout.parse("tp=1,pp=8,dp=1,mbs=1"))
    inter = estimate(model, cluster, job, Layout.parse(base))
    # Interleaving divides the bubble by v (same mean stage time, v = 2).
    assert inter.breakdown.pp_bubble_s == pytest.approx(plain.breakdown.pp_bubble_s / 2,
                                                        rel=0.05)


def test_megatron_uneven_splits_follow_its_rules() -> None:
    # Llama-3.1-405B, 126 layers on PP8 VPP8 with --account-for-embedding/loss-in-pipeline-
    # split: 128 counted layers, 16 per rank, 2 per virtual stage; the first and last build one.
    split = resolve_split(126, 8, 8, embedding=True, loss=True)
    assert not isinstance(split, tuple)
    assert split.chunks[0] == 1 and split.chunks[-1] == 1 and set(split.chunks[1:-1]) == {2}
    assert split.rank_layers == [15] + [16] * 6 + [15]
    # Qwen3-235B-A22B, 94 layers on PP8 VPP4: 96 counted, 12 per rank, 3 per virtual stage.
    qwen = resolve_split(94, 8, 4, embedding=True, loss=True)
    assert not isinstance(qwen, tuple) and sum(qwen.chunks) == 94 and qwen.chunks[0] == 2
    # --decoder-first/last-pipeline-num-layers: 32 layers, PP4 VPP2, first 6, last 6 -> 10 in
    # each middle rank (5 per virtual stage); an odd middle count is refused as Megatron does.
    first_last = resolve_split(32, 4, 2, first=6, last=6)
    assert not isinstance(first_last, tuple) and first_last.rank_layers == [6, 10, 10, 6]
    refused = resolve_split(32, 4, 2, first=5, last=5)
    assert isinstance(refused, tuple) and "divisible by vpp" in refused[2]
    assert isinstance(resolve_split(32, 4, 1, first=6, embedding=True), tuple)


def test_megatron_layout_string_as_megatron_parses_it() -> None:
    # The DeepSeek-V3 example of Megatron's docs (PP16 VPP2): E + 3 decoders, 29 stages of two,
    # an MTP stage and a loss stage.
    stages = parse_megatron_layout("Et*3|(tt|)*29,m|L")
    assert not isinstance(stages, str) and len(stages) == 32
    assert stages[0] == ["embedding"] + ["decoder"] * 3 and stages[-2:] == [["mtp"], ["loss"]]
    split = resolve_split(61, 16, 2, pp_layout="Et|(tt|)*30,L")
    assert not isinstance(split, tuple) and split.chunks == (1,) + (2,) * 30 + (0,)
    assert split.megatron_layout.startswith("Et|tt|") and split.megatron_layout.endswith("|L")
    mtp = resolve_split(61, 16, 2, pp_layout="Et*3|(tt|)*29,m|L")
    assert isinstance(mtp, tuple) and "drop 'm'" in mtp[2]


def test_v_schedules_place_the_last_stage_on_rank_zero() -> None:
    split = resolve_split(16, 4, 2, v_shape=True)
    assert not isinstance(split, tuple)
    assert [split.rank_of(c) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]


def test_dispatcher_volume() -> None:
    # 8 experts on 4 ranks (2 each), top-2: a rank holds none of a token's experts with
    # probability C(6,2)/C(8,2) = 15/28.
    assert expected_ranks(2, 8, 4) == pytest.approx(4 * (1 - 15 / 28))
    tokens, h = 1000.0, 4096
    name, _, alltoall = dispatch_message("alltoall", tokens, h, 2, 8, 4, 1.25)
    assert name == "all_to_all" and alltoall == pytest.approx(tokens * 2 * h * 2 * 1.25)
    _, _, flex = dispatch_message("flex", tokens, h, 2, 8, 4, 1.25)
    assert flex == pytest.approx(tokens * 4 * (13 / 28) * h * 2 * 1.25)
    first, second, gathered = dispatch_message("allgather", tokens, h, 2, 8, 4, 1.25)
    assert (first, second) == ("all_gather", "reduce_scatter")
    assert gathered == pytest.approx(4 * tokens * h * 2)
    # DeepSeek-V3: 256 experts, top-8, EP 64: DeepEP sends each token to ~7.6 ranks, not 8.
    assert expected_ranks(8, 256, 64) == pytest.approx(
        64 * (1 - math.comb(252, 8) / math.comb(256, 8)))


def test_deepep_sends_a_token_once_per_remote_node() -> None:
    # DeepSeek-V3 on EP 64 = 8 nodes of 32 experts: a token reaches 8 (1 - C(224,8)/C(256,8))
    # ~ 5.3 nodes, 7/8 of them remote, against ~7.6 ranks, 56/64 of them remote.
    tokens, h = 4096.0, 7168
    nodes = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert rdma_message(tokens, h, 8, 256, 8, 1.0) == pytest.approx(tokens * nodes * 7 / 8 * h * 2)
    assert rdma_message(tokens, h, 8, 256, 1, 1.0) == 0.0
    cluster = cluster_preset("dgx-h100").with_nodes(8)
    model = model_preset("deepseek-v3")
    job = Job(seq_len=4096, global_batch_size=64)
    layout = Layout(dp=64, ep=64, zero_stage=1, recompute="full")
    est = estimate(model, cluster, job, layout, options=CostOptions(moe_dispatcher="flex"))
    (ep,) = [c for c in est.collectives if c.dimension == "ep"]
    # The NIC carries the remote nodes' copies at DeepEP's measured RDMA fraction of 50 GB/s.
    remote = rdma_message(tokens, h, 8, 256, 8, CostOptions().moe_load_imbalance)
    per_call = ep.time_s / ep.calls_per_step
    assert per_call == pytest.approx(remote / (50e9 * DEEPEP_RDMA_EFFICIENCY), rel=0.02)


def test_hsdp_shards_inside_the_node_and_all_reduces_across() -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(2)
    job = Job(seq_len=4096, global_batch_size=32)
    hsdp = estimate(model, cluster, job, Layout.parse("dp=16,zero=3,shard=8"))
    full = estimate(model, cluster, job, Layout.parse("dp=16,zero=3"))
    gathers = {c.group_size for c in hsdp.collectives if c.collective == "all_gather"}
    assert gathers == {8} and hsdp.links["dp"] == "nvlink"
    replica = [c for c in hsdp.collectives if c.collective == "all_reduce"]
    assert len(replica) == 1 and replica[0].group_size == 2
    # Each replica all-reduces its 1/8 shard of the fp32 gradients.
    grads = [c for c in full.collectives if c.collective == "reduce_scatter"][0]
    assert replica[0].message_bytes == pytest.approx(grads.message_bytes / 8, rel=1e-6)
    # Optimizer state over 8 shards instead of 16: twice as much per GPU.
    assert hsdp.memory.optimizer_bytes == pytest.approx(2 * full.memory.optimizer_bytes, rel=1e-6)


def test_recompute_modules_release_their_tensors() -> None:
    model = model_preset("mixtral-8x7b")
    layout = Layout()
    dense = activation_bytes_per_token(model, layout, False)
    moe = activation_bytes_per_token(model, layout, True)
    assert dense.kept("selective") == dense.total - dense.softmax  # default core_attn
    assert dense.kept("selective", ("core_attn", "mlp")) == pytest.approx(
        dense.total - dense.softmax - dense.mlp_inner)
    # moe_act drops the second expert GEMM's input per routed copy: top-2 x 1.25 imbalance x
    # 14336 columns x 2 bytes.
    released = dict(moe.modules)["moe_act"]
    assert released == pytest.approx(2 * 1.25 * 14336 * 2)
    assert moe.kept("selective", ("moe_act",)) == pytest.approx(moe.total - released)
    assert moe.kept("selective", ("moe",)) < moe.kept("selective", ("moe_act",))
    assert dict(moe.modules)["mla_up_proj"] == 0.0


def test_recompute_layers_is_megatrons_block_method() -> None:
    layout = Layout.parse("pp=2,vpp=2,recompute=full,rlayers=3")  # 16 layers: 4 per stage
    assert recomputed_fraction(layout, 16, 0) == pytest.approx(6 / 8)
    assert recomputed_fraction(Layout.parse("recompute=full"), 16, 0) == 1.0
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(1)
    job = Job(seq_len=4096, global_batch_size=64)
    full = estimate(model, cluster, job, Layout.parse("dp=8,recompute=full"))
    half = estimate(model, cluster, job, Layout.parse("dp=8,recompute=full,rlayers=16"))
    none = estimate(model, cluster, job, Layout.parse("dp=8"))
    assert half.breakdown.recompute_s == pytest.approx(full.breakdown.recompute_s / 2)
    assert full.memory.activations_bytes < half.memory.activations_bytes
    assert half.memory.activations_bytes < none.memory.activations_bytes


def test_tp_overlap_hides_behind_gemms_but_never_the_first_chunk() -> None:
    model, cluster = model_preset("llama3-70b"), cluster_preset("dgx-h100").with_nodes(1)
    job = Job(seq_len=8192, global_batch_size=8)
    layout = Layout.parse("tp=8,dp=1,sp=on")
    off = estimate(model, cluster, job, layout)
    on = estimate(model, cluster, job, layout, options=CostOptions(tp_comm_overlap=True))
    assert off.breakdown.tp_exposed_s / 8 <= on.breakdown.tp_exposed_s
    assert on.breakdown.tp_exposed_s < off.breakdown.tp_exposed_s


def test_uneven_interleaved_bubble_is_the_mean_stage_over_v() -> None:
    """Llama-3.1-405B on PP8 VPP8 with the embedding and loss counted: ranks hold 15, 16 x 6,
    15 layers; with 1 s forward and 2 s backward per layer the mean rank takes
    (2 x 15 + 6 x 16) / 8 x 3 s, and the interleaved bubble is (p-1)/v of it."""
    from placer.cost.compute import PassTimes
    from placer.cost.step import _bubble, _StageTime

    layout = Layout.parse("pp=8,vpp=8,emb=on,loss=on")
    ranks = layout.pipeline_split(126).rank_layers
    assert ranks == [15] + [16] * 6 + [15]
    stages = [_StageTime(PassTimes(1.0 * n, 2.0 * n, 0.0, 1.5 * n), 0.0, 0.0, 0.0, 0.0)
              for n in ranks]
    mean = (2 * 15 + 6 * 16) / 8 * 3
    assert _bubble(layout, stages) == pytest.approx(7 / 8 * mean)
    # ZB-H1 on the same ranks: W = GEMM time / 3 = 0.5 s per layer.
    zb = Layout.parse("pp=8,vpp=8,emb=on,loss=on,schedule=zb1p")
    mean_f, mean_b = mean / 3, 2 * mean / 3
    assert _bubble(zb, stages) == pytest.approx(7 * (mean_f + mean_b - 2 * mean_f / 2) / 8)


def test_an_automatic_uneven_split_says_which_megatron_flags_run_it() -> None:
    from placer.spec.pipeline import split_notes

    counted = split_notes(Layout.parse("pp=8,vpp=8"), 126)
    assert len(counted) == 1 and "--account-for-embedding-in-pipeline-split" in counted[0]
    balanced = split_notes(Layout.parse("pp=4,vpp=4"), 61)
    assert len(balanced) == 1 and "--pipeline-model-parallel-layout 'Ett|t*4|" in balanced[0]
    assert split_notes(Layout.parse("pp=4,vpp=2"), 32) == []  # even
    assert split_notes(Layout.parse("pp=8,vpp=8,emb=on,loss=on"), 126) == []  # the layout says


def _torch_interleaved_peak_chunks(p: int, v: int, m: int, rank: int,
                                   chunks: tuple[int, ...] | None = None) -> int:
    """Most forward chunks rank ``rank`` holds before their backward in torch 2.13's
    ScheduleInterleaved1F1B (torch/distributed/pipelining/schedules.py, the "flex_pp" form:
    N = m // max(1, m // p) contiguous micro-batches per local stage), read off the action list
    the schedule itself builds for that rank; with ``chunks`` (decoder layers per global stage
    index), the most decoder layers it holds instead."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    rounds = max(1, m // p)
    plan = SimpleNamespace(n_local_stages=v, pp_group_size=p, _n_microbatches=m,
                           microbatches_per_round=m // rounds)
    held = peak = 0
    for action in ScheduleInterleaved1F1B._calculate_single_rank_operations(plan, rank):
        if action is None:
            continue
        weight = 1 if chunks is None else chunks[action.stage_index]
        if action.computation_type == _ComputationType.FORWARD:
            held += weight
            peak = max(peak, held)  # its backward comes later: held until then
        else:
            held -= weight
    return peak


@pytest.mark.parametrize(("p", "v", "m"), [(16, 8, 32), (16, 8, 16), (4, 2, 8), (8, 4, 24)])
def test_interleaved_in_flight_matches_torchs_flexible_schedule(p: int, v: int, m: int) -> None:
    """The Llama 3 paper's schedule with a tunable number of contiguous micro-batches (section
    3.3.2) is torch's flexible Interleaved 1F1B; where m is a multiple of p its N is p, and every
    rank's peak is what placer counts (the 405B rows: PP 16, V 8, 32 and 16 micro-batches)."""
    layout = Layout(tp=1, pp=p, dp=1, vpp=v, micro_batch_size=1)
    for rank in range(p):
        assert microbatches_in_flight(layout, rank, m) * v == _torch_interleaved_peak_chunks(
            p, v, m, rank), rank


@pytest.mark.parametrize(("p", "v", "m"), [(16, 8, 24), (4, 2, 6), (4, 2, 10), (8, 4, 12),
                                           (4, 3, 3)])
def test_interleaved_in_flight_where_m_is_no_multiple_of_pp(p: int, v: int, m: int) -> None:
    """m not a multiple of p: megatron-core's default N = p refuses it (a last group of fewer
    than p), torch's flexible schedule runs N = m // max(1, m // p) and keeps more in flight."""
    layout = Layout(tp=1, pp=p, dp=1, vpp=v, micro_batch_size=1)
    for rank in range(p):
        assert microbatches_in_flight(layout, rank, m) * v == _torch_interleaved_peak_chunks(
            p, v, m, rank), rank


def test_interleaved_in_flight_pp16_v8_24_microbatches_by_hand() -> None:
    """PP 16, V 8, 24 micro-batches: torch's N = 24 // max(1, 24 // 16) = 24, so rank 0's
    warm-up is 2 x 15 + 7 x 24 = 198 chunks, more than its 8 x 24 = 192: all of them are in
    flight at once (N = p would say 2 x 15 + 7 x 16 + 1 = 143)."""
    layout = Layout(tp=1, pp=16, dp=1, vpp=8, micro_batch_size=1)
    assert microbatches_in_flight(layout, 0, 24) * 8 == 192


def test_interleaved_in_flight_counts_the_405b_split_chunk_by_chunk() -> None:
    """The Llama 3 paper's 405B split (126 layers over 16 ranks x 8 chunks, the first chunk the
    embedding alone, the last the output layer and loss: emb=on,loss=on) counted by hand, and
    on every rank against torch's schedule weighted by each chunk's layers.

    Rank 0 (chunks 0, 16, ..., 112: 0, then 7 x 1 layer), 32 micro-batches, N = 16: its
    2 x 15 + 7 x 16 = 142 warm-up forwards are 16 of the empty chunk, 16 of each layered one
    and 14 more of the empty one; the backwards then start from its last chunk, so the peak
    is 7 x 16 = 112 layer-micro-batches (even chunks would say 143 / 8 x 7 = 125.1). Rank 15
    (chunks 15, ..., 127: 7 x 1 layer, then 0): 7 x 16 = 112 warm-up forwards of its layered
    chunks, the empty chunk's 16 forwards and backwards leave 112, then the second group's
    first forward (1 layer) comes before the backward it pairs with: 113 (even chunks: 98.9)."""
    model = model_preset("llama3-405b")
    layout = Layout.parse("pp=16,vpp=8,emb=on,loss=on,dp=1")
    chunks = layout.pipeline_split(model.num_layers).chunks
    assert chunks == (0,) + (1,) * 126 + (0,)
    layers = {0: 7, 1: 8, 15: 7}
    held = {r: microbatches_in_flight(layout, r, 32, chunks) * layers[r] for r in layers}
    assert held == pytest.approx({0: 112, 1: 141, 15: 113})
    for rank in range(16):
        own = sum(chunks[rank::16])
        assert microbatches_in_flight(layout, rank, 32, chunks) * own == pytest.approx(
            _torch_interleaved_peak_chunks(16, 8, 32, rank, chunks)), rank


@pytest.mark.parametrize(("p", "v"), [(4, 2), (4, 3), (8, 4), (3, 5)])
def test_interleaved_in_flight_matches_torch_on_uneven_splits(p: int, v: int) -> None:
    """Splits with empty and uneven chunks, m a multiple of p or torch's flexible case:
    placer's chunk-by-chunk count equals torch's schedule's, and the saturated micro-batch count
    the memory cache keys on holds what the real one holds."""
    import random

    from placer.cost.pipeline import saturated_microbatches

    rng = random.Random(20)
    layout = Layout(tp=1, pp=p, dp=1, vpp=v, micro_batch_size=1)
    for m in range(1, 4 * p + 1):
        if m % max(1, m // p):
            continue  # torch refuses it (n_microbatches % num_rounds)
        for _ in range(3):
            chunks = tuple(rng.choice((0, 1, 2, 3)) for _ in range(p * v))
            for rank in range(p):
                own = chunks[rank::p]
                held = microbatches_in_flight(layout, rank, m, chunks)
                torch_peak = _torch_interleaved_peak_chunks(p, v, m, rank, chunks)
                if len(set(own)) > 1:
                    assert held * sum(own) == pytest.approx(torch_peak), (m, chunks, rank)
                elif own[0]:
                    assert held * v * own[0] == torch_peak, (m, chunks, rank)
                assert microbatches_in_flight(
                    layout, rank, saturated_microbatches(layout, m), chunks) == held


def test_a_later_rank_of_the_same_shape_can_hold_more_and_is_priced() -> None:
    """Llama-3-8B, PP 4 x V 2, stages 2/2/10/2/2/10/2/2, 8 micro-batches (N = 4): ranks 1 and 2
    both hold 12 decoder layers and neither end, but rank 1's chunks are (2, 10) and rank 2's
    (10, 2). By hand, rank 2: 2 x 1 + 4 = 6 warm-up forwards (4 of its 10-layer chunk, 2 of
    the 2-layer one: 44), then each forward before its backward: +2 -2, +2 -2, +10 -2,
    +10 -2, +10 -> 70 layer-micro-batches; rank 1: 8 warm-up forwards (4 x 2 + 4 x 10 = 48),
    then +2 -> 50 and down (even chunks would say 54 and 42). Torch's schedule says the same,
    and the memory estimate's worst stage is rank 2, which it would skip were same-shaped
    stages taken as no worse than the first of them."""
    from placer.cost.memory import memory_estimate

    model = model_preset("llama3-8b")
    layout = Layout.parse("pp=4,vpp=2,dp=1,stages=2/2/10/2/2/10/2/2")
    chunks = layout.pipeline_split(model.num_layers).chunks
    assert microbatches_in_flight(layout, 1, 8, chunks) * 12 == pytest.approx(50)
    assert microbatches_in_flight(layout, 2, 8, chunks) * 12 == pytest.approx(70)
    for rank in (1, 2):
        assert microbatches_in_flight(layout, rank, 8, chunks) * 12 == pytest.approx(
            _torch_interleaved_peak_chunks(4, 2, 8, rank, chunks))
    job = Job(seq_len=8192, global_batch_size=8)
    assert memory_estimate(model, cluster_preset("dgx-h100"), job, layout).worst_stage == 2
