"""Memory per GPU: Korthikanti's activation table, ZeRO bytes per parameter, pipeline in-flight
micro-batches, worst stage, expert sharding, and the minimum-GPU bound."""

from __future__ import annotations

import pytest

from placer.cost import memory_estimate, minimum_gpus_needed
from placer.cost.memory import activation_bytes_per_token, microbatches_in_flight
from placer.cost.options import CostOptions
from placer.cost.params import stage_params, stage_shapes, total_params
from placer.spec import Job, Layout, Model
from placer.spec.model import MoE
from placer.spec.presets import cluster_preset, model_preset

# GPT 22B of Korthikanti et al. (Table 3): MHA, FFN = 4h, plain GeLU MLP, Megatron's dropout 0.1.
GPT22B = Model(name="gpt-22b", num_layers=48, hidden_size=6144, num_attention_heads=64,
               ffn_hidden_size=4 * 6144, gated_mlp=False, vocab_size=51200,
               tied_embeddings=True, hidden_dropout=0.1, attention_dropout=0.1)
S = 2048
NORM_STATS = 2 * 4  # fp32 rstd of the two norms per token (Table 2 leaves them out)


def per_token(layout: Layout, flash: bool = False) -> float:
    parts = activation_bytes_per_token(GPT22B, layout, False, flash_attention=flash, seq_len=S)
    return parts.total


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_table_2_tensor_parallel(t: int) -> None:
    h, a = 6144, 64
    expected = h * (10 + 24 / t + 5 * a * S / (h * t))  # bytes per token: sbh(...) / (sb)
    assert per_token(Layout(tp=t)) == pytest.approx(expected + NORM_STATS)


def test_korthikanti_table_2_sequence_parallel_and_selective() -> None:
    h, a, t = 6144, 64, 8
    sp = Layout(tp=t, sequence_parallel=True)
    stats = NORM_STATS / t
    assert per_token(sp) == pytest.approx(h * (34 / t + 5 * a * S / (h * t)) + stats)
    # Selective recomputation drops exactly the 5as/h score terms: 34/t with SP, 10 + 24/t without.
    parts = activation_bytes_per_token(GPT22B, sp, False, flash_attention=False, seq_len=S)
    assert parts.kept("selective") == pytest.approx(h * 34 / t + stats)
    plain = activation_bytes_per_token(GPT22B, Layout(tp=t), False, flash_attention=False,
                                       seq_len=S)
    assert plain.kept("selective") == pytest.approx(h * (10 + 24 / t) + NORM_STATS)


def test_full_recompute_keeps_only_the_layer_input() -> None:
    parts = activation_bytes_per_token(GPT22B, Layout(tp=8), False)
    assert parts.checkpoint == 2 * 6144  # 2sbh per layer, Table 2
    sp = activation_bytes_per_token(GPT22B, Layout(tp=8, sequence_parallel=True), False)
    assert sp.checkpoint == pytest.approx(2 * 6144 / 8)


def test_flash_attention_stores_no_scores_and_gqa_shrinks_k_v() -> None:
    mha = Model(name="mha", num_layers=2, hidden_size=4096, num_attention_heads=32,
                ffn_hidden_size=4 * 4096, gated_mlp=False, vocab_size=1000, hidden_dropout=0.1)
    gqa = mha.model_copy(update={"num_kv_heads": 8})
    layout = Layout(tp=1)
    flash = activation_bytes_per_token(mha, layout, False)
    # 34h plus the fp32 log-sum-exp per head, nothing quadratic in s.
    assert flash.total == pytest.approx(34 * 4096 + 4 * 32 + NORM_STATS)
    # K and V: 2 x 2 bytes x (g d) instead of (a d) per token.
    saved = activation_bytes_per_token(mha, layout, False).total - activation_bytes_per_token(
        gqa, layout, False).total
    assert saved == pytest.approx(2 * 2 * (32 - 8) * 128)


def test_gated_mlp_keeps_both_halves_before_the_activation() -> None:
    plain = Model(name="plain", num_layers=2, hidden_size=1024, num_attention_heads=8,
                  ffn_hidden_size=4096, gated_mlp=False, vocab_size=1000)
    gated = plain.model_copy(update={"gated_mlp": True})
    diff = (activation_bytes_per_token(gated, Layout(), False).total
            - activation_bytes_per_token(plain, Layout(), False).total)
    assert diff == 2 * 4096


def test_in_flight_micro_batches_1f1b_and_interleaved() -> None:
    # 1F1B: stage r holds min(p - r, m); interleaved stage 0 holds p (1 + (p-1)/(p v)).
    assert microbatches_in_flight(Layout(pp=4, dp=1), 0, 16) == 4
    assert microbatches_in_flight(Layout(pp=4, dp=1), 3, 16) == 1
    assert microbatches_in_flight(Layout(pp=4, dp=1), 0, 2) == 2
    assert microbatches_in_flight(Layout(pp=4, vpp=2), 0, 16) == pytest.approx(4 * (1 + 3 / 8))
    assert microbatches_in_flight(Layout(), 0, 16) == 1


def zero_bytes_per_param(zero: int, dp: int) -> float:
    model = model_preset("llama3-8b")
    cluster = cluster_preset("dgx-h100")
    job = Job(seq_len=1024, global_batch_size=dp)
    layout = Layout(dp=dp, zero_stage=zero)
    mem = memory_estimate(model, cluster, job, layout)
    state = mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes
    return state / total_params(model)


@pytest.mark.parametrize(("zero", "expected"), [
    (0, 18.0),  # bf16 weights, fp32 grads, fp32 master + Adam moments (Megatron's 18)
    (1, 6 + 12 / 8),  # distributed optimizer: 6 + 12/d
    (2, 2 + 16 / 8),
    (3, 18 / 8),
])
def test_zero_bytes_per_parameter(zero: int, expected: float) -> None:
    assert zero_bytes_per_param(zero, 8) == pytest.approx(expected, rel=1e-6)


def test_first_stage_holds_the_embedding_and_most_activations() -> None:
    model = model_preset("llama3-70b")
    layout = Layout(tp=8, pp=4, dp=2, sequence_parallel=True, zero_stage=1)
    job = Job(seq_len=4096, global_batch_size=64)
    mem = memory_estimate(model, cluster_preset("dgx-h100").with_nodes(8), job, layout)
    assert mem.worst_stage == 0
    shapes = stage_shapes(model, layout)
    first, middle = (stage_params(model, layout, shapes[i]).total for i in (0, 1))
    assert first - middle == pytest.approx(model.vocab_size * model.hidden_size / 8)
    assert mem.total_bytes == sum(v for k, v in mem.model_dump().items()
                                  if k.endswith("_bytes") and k not in ("total_bytes",
                                                                        "capacity_bytes"))


def test_experts_are_sharded_over_expert_parallelism() -> None:
    model = model_preset("mixtral-8x7b")
    job = Job(seq_len=4096, global_batch_size=16)
    cluster = cluster_preset("dgx-h100")
    one = memory_estimate(model, cluster, job, Layout(dp=8, ep=1, zero_stage=1))
    eight = memory_estimate(model, cluster, job, Layout(dp=8, ep=8, zero_stage=1))
    assert eight.weights_bytes < one.weights_bytes / 3
    assert eight.moe_buffers_bytes > 0


def test_fp8_keeps_linear_inputs_in_one_byte() -> None:
    model = model_preset("llama3-8b")
    cluster = cluster_preset("dgx-h100")
    layout = Layout(dp=8, zero_stage=1)
    bf16 = memory_estimate(model, cluster, Job(seq_len=4096, global_batch_size=8), layout)
    fp8 = memory_estimate(model, cluster, Job(seq_len=4096, global_batch_size=8,
                                              precision="fp8"), layout)
    assert fp8.activations_bytes < bf16.activations_bytes


def test_minimum_gpus_needed_is_the_fully_sharded_state_over_usable_memory() -> None:
    model = model_preset("llama3-405b")
    cluster = cluster_preset("dgx-a100").with_nodes(2)
    need = minimum_gpus_needed(model, cluster, Job(seq_len=4096, global_batch_size=16))
    state = total_params(model) * 18
    assert need.state_bytes == state
    assert need.gpus > 16
    assert state / need.gpus <= need.per_gpu_bytes < state / (need.gpus - 1)
    assert "16 x" in need.reason and f"at least {need.gpus} GPUs" in need.reason
    assert "\n" not in need.reason


def test_moe_layer_keeps_expert_inputs_and_probabilities_not_outputs() -> None:
    # 16 experts of FFN 512, top-4, hidden 1024, balanced; tp = 1.
    moe = Model(name="small-moe", num_layers=2, hidden_size=1024, num_attention_heads=8,
                ffn_hidden_size=4096, vocab_size=1000,
                moe=MoE(num_experts=16, top_k=4, expert_ffn_hidden_size=512))
    h, fe, k, e = 1024, 512, 4, 16
    parts = activation_bytes_per_token(moe, Layout(dp=4, ep=4), True, moe_load_imbalance=1.0)
    # Per routed copy: the first GEMM's input (2h), the gated activation's two inputs (2 x 2fe),
    # the second GEMM's input (2fe) and the fp32 router probability the activation applies;
    # then the router input (2h), fp32 probabilities over experts and their transposed copy,
    # the int64 top-k indices, the bool routing map and one int64 sorted index per copy
    # (no dropout: rate 0).
    per_routed = 2 * h + 2 * 2 * fe + 2 * fe + 4 + 8
    routing = 2 * 4 * e + 8 * k + e
    assert parts.mlp_inner + 2 * h == pytest.approx(k * per_routed + 2 * h + routing)


def test_deepspeed_zero3_holds_submodules_not_whole_layers() -> None:
    model = model_preset("gpt3-175b")
    cluster = cluster_preset("dgx-a100").with_nodes(48)
    job = Job(seq_len=2048, global_batch_size=384)
    layout = Layout(dp=384, zero_stage=3, recompute="full")
    fsdp = memory_estimate(model, cluster, job, layout)
    deepspeed = memory_estimate(model, cluster, job, layout,
                                CostOptions(zero3_max_live_params=1e9))
    h, v = 12288, 51200
    # A layer's share of the stage's parameters (Megatron's count, no biases; the final norm
    # spread over the 96 layers); the tied embedding (v h) is a smaller FSDP unit than a layer.
    layer = (96 * (12 * h * h + 2 * h) + h) / 96
    assert v * h < layer
    # FSDP: current and prefetched layer in bf16 plus one layer's fp32 gradients. DeepSpeed: the
    # 1e9 live-parameter limit (above the largest weight, 4h x h) plus the 5e7 prefetch bucket,
    # and a 5e8-parameter gradient bucket.
    fsdp_transient = layer * (2 * 2 + 4)
    ds_transient = (1e9 + 5e7) * 2 + 5e8 * 4
    saved = fsdp.activations_bytes - deepspeed.activations_bytes
    assert saved == pytest.approx(fsdp_transient - ds_transient, abs=2)
    assert deepspeed.total_bytes < fsdp.total_bytes
    with pytest.raises(ValueError, match="positive"):
        CostOptions(zero3_max_live_params=0)


def test_te_cross_entropy_keeps_the_bf16_logits_and_overwrites_them() -> None:
    """Hand count: Megatron's native fused loss peaks at the fp32 softmax plus its bf16 gradient
    (4 + 2 B per logit entry); Transformer Engine's keeps the bf16 logits and writes the gradient
    into them (2 B; transformer_engine/pytorch/triton/cross_entropy.py); the job's runtime
    picks it."""
    model = model_preset("llama3-8b")
    layout = Layout(tp=2, dp=4, sequence_parallel=True, zero_stage=1, micro_batch_size=2)
    cluster = cluster_preset("dgx-h100")
    entries = 2 * 8192 * model.vocab_size / 2  # tokens x local vocabulary (tp 2)
    native = memory_estimate(model, cluster, Job(seq_len=8192, global_batch_size=64), layout)
    te_job = Job(seq_len=8192, global_batch_size=64, runtime={"cross_entropy_impl": "te"})
    te = memory_estimate(model, cluster, te_job, layout)
    assert native.logits_bytes == pytest.approx(6 * entries, abs=1)
    assert te.logits_bytes == pytest.approx(2 * entries, abs=1)
    eager = memory_estimate(model, cluster, te_job, layout, CostOptions(fused_kernels=False,
                                                                         cross_entropy_impl="te"))
    assert eager.logits_bytes == pytest.approx(12 * entries, abs=1)  # TE's kernel needs TE
    # flash-attn's CrossEntropyLoss (llm-foundry's MPT) keeps the bf16 logits and writes a new
    # bf16 gradient (2 + 2 B), reachable from a job file too
    flash_job = Job(seq_len=8192, global_batch_size=64,
                    runtime={"cross_entropy_impl": "flash_attn"})
    flash = memory_estimate(model, cluster, flash_job, layout)
    assert flash.logits_bytes == pytest.approx(4 * entries, abs=1)


def test_a_job_whose_launcher_sets_expandable_segments_keeps_no_fragmentation() -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100")
    layout = Layout(dp=8, zero_stage=1)
    plain = memory_estimate(model, cluster, Job(seq_len=8192, global_batch_size=64,
                                                runtime={"expandable_segments": False}), layout)
    job = Job(seq_len=8192, global_batch_size=64, runtime={"expandable_segments": True})
    stitched = memory_estimate(model, cluster, job, layout)
    assert plain.fragmentation_bytes > 0 and stitched.fragmentation_bytes == 0
    assert plain.total_bytes - stitched.total_bytes == plain.fragmentation_bytes


def test_fsdp_under_pipelining_gathers_only_what_it_shards() -> None:
    """FSDP2 under pipelining keeps a stage's gathered bf16 weights and fp32 unsharded gradients
    for the whole step, on top of the shards. Experts that EP alone shards (expert-dp 1) are
    outside FSDP (NeMo AutoModel's apply_fsdp passes them as ignored_params): one copy each, as
    without ZeRO. Hand count on the worst stage: dense state twice (shard + gathered), experts
    once; with expert-dp 2 the experts are gathered too."""
    model, cluster = model_preset("mixtral-8x7b"), cluster_preset("dgx-h100").with_nodes(2)
    job = Job(seq_len=4096, global_batch_size=64)

    def weights_and_grads(ep: int) -> tuple[float, float, float, float]:
        layout = Layout(pp=2, dp=8, ep=ep, zero_stage=3, recompute="full")
        memory = memory_estimate(model, cluster, job, layout)
        shape = next(s for s in stage_shapes(model, layout) if s.stage == memory.worst_stage)
        params = stage_params(model, layout, shape)
        return memory.weights_bytes, memory.gradients_bytes, params.dense, params.expert

    weights, grads, dense, expert = weights_and_grads(8)  # expert-dp 1: outside FSDP
    assert weights == pytest.approx(2 * (dense / 8 + dense + expert), abs=2)
    assert grads == pytest.approx(4 * (dense / 8 + dense + expert), abs=2)
    weights, grads, dense, expert = weights_and_grads(4)  # expert-dp 2: sharded and gathered
    assert weights == pytest.approx(2 * (dense / 8 + dense + expert / 2 + expert), abs=2)
    assert grads == pytest.approx(4 * (dense / 8 + dense + expert / 2 + expert), abs=2)


def test_nvfp4_linears_save_their_inputs_at_four_and_a_half_bits() -> None:
    """Transformer Engine's Linear keeps its quantized (column-wise) input for the backward; under
    the NVFP4 recipe that is 4 bits per element plus one FP8 scale per 16 elements. Hand count on
    a Llama-3-8B layer at TP 2 with SP: the QKV and gate/up inputs (h/2 each), the output
    projection's input copy (16 heads x 128) and the down projection's (14336/2) shrink from 1
    byte to 9/16, and nothing else changes."""
    model, layout = model_preset("llama3-8b"), Layout(tp=2, dp=4, sequence_parallel=True)
    fp8 = activation_bytes_per_token(model, layout, False, fp8=True)
    fp4 = activation_bytes_per_token(model, layout, False, fp8=True, fp4=True)
    elements = 2 * 4096 / 2 + 16 * 128 + 14336 / 2
    assert fp8.total - fp4.total == pytest.approx(elements * (1 - 9 / 16))
    assert fp4.qkv == fp8.qkv and fp4.norms == fp8.norms
    # without FP8 (bf16 linears) the flag does nothing: NVFP4 is a recipe of FP8 jobs here
    bf16 = activation_bytes_per_token(model, layout, False)
    assert activation_bytes_per_token(model, layout, False, fp4=True) == bf16
