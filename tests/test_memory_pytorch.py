"""The memory model against PyTorch: real blocks built and measured on CPU.

Each test builds the block with tests/torch_blocks.py (a Llama layer in Megatron/TE's fused
style and in torchtitan's eager style, an MoE layer), runs it in bf16 and measures with
``torch.distributed._tools.mem_tracker.MemTracker`` what the forward keeps for backward and the
peak of forward plus backward, then compares with placer's per-token figures
(``placer.cost.memory``). Large shapes run under ``FakeTensorMode`` (no data, exact sizes); the
MoE block, whose routing has data-dependent shapes, runs on real tensors at a small size.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed._tools.mem_tracker")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch_blocks import (  # noqa: E402
    BlockShape,
    compiled_op_kept_bytes,
    kept_bytes,
    loss_bytes,
    peak_bytes,
    stack_loss_peak_bytes,
)

from placer.cost.memory import (  # noqa: E402
    COMPILED_LOSS_PEAK_BYTES_PER_ENTRY,
    EAGER_LOSS_PEAK_BYTES_PER_ENTRY,
    LOGITS_BYTES_PER_ENTRY,
    LOSS_PARALLEL_PEAK_BYTES_PER_ENTRY,
    activation_bytes_per_token,
    memory_estimate,
)
from placer.cost.options import CostOptions  # noqa: E402
from placer.spec import Job, Layout, Model  # noqa: E402
from placer.spec.model import MoE  # noqa: E402
from placer.spec.presets import cluster_preset  # noqa: E402

# MemTracker warns about autograd outputs that are None (weight gradients freed by the hooks).
pytestmark = pytest.mark.filterwarnings("ignore:Expected a tensor or a traceable wrapper")

SEQ = 2048
# A Llama-style layer: hidden 2048, 16 heads, 4 KV heads (GQA), head dim 128, SwiGLU 5632.
H, A, KV, D, F = 2048, 16, 4, 128, 5632


def _model(dropout: float = 0.0, moe: MoE | None = None, **dims: int) -> Model:
    size = {"hidden_size": H, "num_attention_heads": A, "num_kv_heads": KV,
            "ffn_hidden_size": F} | dims
    return Model(name="llama-block", num_layers=1, vocab_size=32000, gated_mlp=True,
                 hidden_dropout=dropout, moe=moe, **size)


def _shape(tp: int, sp: bool, fused: bool, dropout: float = 0.0) -> BlockShape:
    return BlockShape(H, A, KV, D, F, tp=tp, sp=sp, fused=fused, hidden_dropout=dropout)


def _parts(tp: int, sp: bool, fused: bool, dropout: float = 0.0):  # noqa: ANN202
    return activation_bytes_per_token(_model(dropout), Layout(tp=tp, sequence_parallel=sp),
                                      False, fused_kernels=fused)


PARALLEL = [(1, False), (2, False), (2, True), (4, True)]
RECOMPUTE = ["none", "selective", "full"]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize(("tp", "sp"), PARALLEL, ids=["tp1", "tp2", "tp2-sp", "tp4-sp"])
@pytest.mark.parametrize("recompute", RECOMPUTE)
def test_kept_activations_match_pytorch(fused: bool, tp: int, sp: bool, recompute: str) -> None:
    with FakeTensorMode():
        measured = kept_bytes(_shape(tp, sp, fused), SEQ, recompute)
    assert _parts(tp, sp, fused).kept(recompute) * SEQ == pytest.approx(measured, rel=1e-9)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "eager"])
@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False)], ids=["tp1", "tp2"])
def test_op_level_selective_checkpointing_matches_pytorch(fused: bool, tp: int, sp: bool) -> None:
    """torchtitan's op-level SAC keeps the layer input, SDPA's outputs and every other matmul's
    output: far less than no recomputation (the memory effect a flash-attention model gets)."""
    with FakeTensorMode():
        measured = kept_bytes(_shape(tp, sp, fused), SEQ, "op")
    parts = _parts(tp, sp, fused)
    assert parts.kept("op") * SEQ == pytest.approx(measured, rel=1e-9)
    assert parts.kept("op") < 0.65 * parts.kept("none")


@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False)], ids=["tp1", "tp2"])
def test_compiled_op_level_checkpointing_matches_pytorch(tp: int, sp: bool) -> None:
    """torch.compile'd, torchtitan's op-level SAC keeps only the saved outputs its backward
    reads: not w2's output (it feeds only the residual add), measured on the tensors
    AOTAutograd's min-cut partitioner saves. Not SP: the block's stand-in reduce-scatter is an
    autograd.Function the partitioner recomputes, a real collective it does not."""
    h, a, kv, d, f, seq = 256, 8, 2, 32, 704, 128  # real tensors: a small layer
    shape = BlockShape(h, a, kv, d, f, tp=tp, sp=sp, fused=False)
    measured = compiled_op_kept_bytes(shape, seq)
    model = _model(hidden_size=h, num_attention_heads=a, num_kv_heads=kv, ffn_hidden_size=f)
    layout = Layout(tp=tp, sequence_parallel=sp)
    compiled = activation_bytes_per_token(model, layout, False, fused_kernels=False,
                                          compiled=True)
    eager = activation_bytes_per_token(model, layout, False, fused_kernels=False)
    assert compiled.kept("op") * seq == pytest.approx(measured, rel=1e-9)
    assert eager.kept("op") - compiled.kept("op") == pytest.approx(2 * h)  # w2's bf16 output
    assert compiled.kept("none") == eager.kept("none")  # only op-level checkpointing changes


def test_dropout_masks_only_with_dropout() -> None:
    with FakeTensorMode():
        plain = kept_bytes(_shape(2, True, True), SEQ, "none")
        dropped = kept_bytes(_shape(2, True, True, dropout=0.1), SEQ, "none")
    assert dropped - plain == pytest.approx(2 * H / 2 * SEQ)  # two 1-byte masks, s/t x h
    parts = _parts(2, True, True, dropout=0.1)
    assert parts.kept("none") * SEQ == pytest.approx(dropped, rel=1e-9)
    assert _parts(2, True, True).dropout == 0


def test_eager_kernels_keep_more_than_fused() -> None:
    """The eager-fused gap PyTorch measures is what the model prices (repeat_kv, SiLU output)."""
    with FakeTensorMode():
        fused = kept_bytes(_shape(1, False, True), SEQ, "none")
        eager = kept_bytes(_shape(1, False, False), SEQ, "none")
    gap = _parts(1, False, False).total - _parts(1, False, True).total
    assert eager - fused == pytest.approx(gap * SEQ, rel=1e-9)
    assert eager > 1.2 * fused


@pytest.mark.parametrize("recompute", ["none", "selective", "op", "full"])
@pytest.mark.parametrize("layers", [1, 3])
def test_dynamic_peak_matches_pytorch(recompute: str, layers: int) -> None:
    """Peak of forward + backward of a stack of eager layers (weight gradients dropped as they
    form): what every layer keeps plus the backward's recomputation and working set. The kept
    bytes are exact; the transient inside one layer's backward depends on the order autograd
    frees buffers in, which the model does not follow: within 5 % of the whole peak."""
    with FakeTensorMode():
        kept, peak = peak_bytes(_shape(1, False, False), SEQ, recompute, layers)
    parts = _parts(1, False, False)
    output = 2 * H * SEQ  # the stack's output, alive until backward
    assert kept == pytest.approx(layers * parts.kept(recompute) * SEQ + output, rel=1e-9)
    predicted = (layers * parts.kept(recompute) + parts.backward_peak(recompute)) * SEQ + output
    assert predicted == pytest.approx(peak, rel=0.05)


def test_cross_entropy_peak_matches_pytorch() -> None:
    """fp32 cross-entropy as torchtitan runs it: 4 bytes per logit kept, 12 at the peak."""
    vocab = 32000
    with FakeTensorMode():
        kept, peak = loss_bytes(SEQ, H, vocab)
    assert kept == pytest.approx(LOGITS_BYTES_PER_ENTRY * SEQ * vocab, rel=1e-6)
    assert peak == pytest.approx(EAGER_LOSS_PEAK_BYTES_PER_ENTRY * SEQ * vocab, rel=1e-6)


@pytest.mark.parametrize("recompute", ["none", "op", "full"])
@pytest.mark.parametrize("layers", [1, 3])
def test_the_last_stage_peaks_at_the_loss_or_the_last_layer_backward_not_both(
        recompute: str, layers: int) -> None:
    """Eager layers, the output layer and an fp32 cross-entropy, forward + backward: the loss
    backward frees its buffers before the last layer's backward starts, so the peak is what is
    held plus the larger of the two. The vocabulary makes the loss peak equal full
    recomputation's layer backward, where adding them would be furthest off."""
    parts = _parts(1, False, False)
    vocab = int(parts.backward_peak("full") / EAGER_LOSS_PEAK_BYTES_PER_ENTRY)
    with FakeTensorMode():
        peak = stack_loss_peak_bytes(_shape(1, False, False), SEQ, vocab, recompute, layers)
    model = _model().model_copy(update={"num_layers": layers, "vocab_size": vocab})
    mem = memory_estimate(model, cluster_preset("dgx-h100"), Job(seq_len=SEQ, global_batch_size=1),
                          Layout(recompute=recompute), CostOptions(fused_kernels=False))
    output = 2 * H * SEQ  # the output layer's saved input
    predicted = mem.activations_bytes + mem.logits_bytes + output
    assert predicted == pytest.approx(peak, rel=0.01)
    both = predicted + min(parts.backward_peak(recompute) * SEQ, mem.logits_bytes)
    assert both > 1.05 * peak  # the sum of the two peaks is not what PyTorch reaches


def _allocated_peak(run) -> float:  # noqa: ANN001
    """Peak of the bytes the CPU allocator hands out while ``run()`` runs (the profiler's
    allocation events: every tensor, including temporaries inside DTensor's op handlers)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def test_loss_parallel_cross_entropy_peak_matches_pytorch() -> None:
    """torchtitan's fp32 cross-entropy under DTensor's loss_parallel (TP > 1, logits sharded over
    the vocabulary), run by PyTorch's own loss_parallel on a one-rank gloo mesh: 16 bytes per
    entry at its peak, against the 12 of the plain F.cross_entropy measured the same way."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import loss_parallel

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already set up")
    tokens, vocab = 512, 4096
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        labels = torch.randint(0, vocab, (tokens,))
        logits = torch.randn(tokens, vocab, dtype=torch.bfloat16)
        plain = logits.clone().requires_grad_()
        sharded = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()

        def run_plain() -> None:
            F.cross_entropy(plain.float(), labels).backward()

        def run_parallel() -> None:
            with loss_parallel():
                F.cross_entropy(sharded.float(), labels).backward()

        entries = tokens * vocab
        assert _allocated_peak(run_plain) / entries == pytest.approx(
            EAGER_LOSS_PEAK_BYTES_PER_ENTRY, rel=1e-3)
        assert _allocated_peak(run_parallel) / entries == pytest.approx(
            LOSS_PARALLEL_PEAK_BYTES_PER_ENTRY, rel=1e-3)
    finally:
        dist.destroy_process_group()


def test_pipeline_last_stage_keeps_every_output_unless_told_not_to() -> None:
    """torch.distributed.pipelining's last stage keeps each micro-batch's output through the step
    and returns their concatenation at its end, while still holding them
    (CostOptions.pipeline_keeps_outputs: m outputs in the backward, 2m at the merge);
    step(return_outputs=False), as torchtitan calls it from Oct 2025, keeps none. A one-rank
    pipeline (its one stage is the last) on a gloo group."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already set up")
    tokens, hidden, vocab, m = 64, 32, 512, 4
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(hidden, hidden), nn.Linear(hidden, vocab))
        stage = PipelineStage(model, 0, 1, torch.device("cpu"))

        def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(out.flatten(0, 1), target.flatten(0, 1))

        schedule = Schedule1F1B(stage, n_microbatches=m, loss_fn=loss_fn)
        x, y = torch.randn(m, tokens, hidden), torch.randint(0, vocab, (m, tokens))
        output = tokens * vocab * 4  # one micro-batch's fp32 output
        merged = schedule.step(x, target=y)
        storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes()
                    for t in (*stage.output_chunks, merged)}
        assert len(storages) == m + 1  # m kept outputs and their concatenation, all distinct
        assert sum(storages.values()) == 2 * m * output
        assert schedule.step(x, target=y, return_outputs=False) is None
        assert not stage.output_chunks
    finally:
        dist.destroy_process_group()


def test_moe_block_matches_pytorch() -> None:
    """Router, permutation, expert MLPs and probabilities of an MoE layer (real tensors)."""
    seq, h, experts, top_k, fe = 256, 256, 8, 2, 128
    shape = BlockShape(h, 4, 2, 64, fe, experts=experts, top_k=top_k)
    measured = kept_bytes(shape, seq, "none")
    model = _model(moe=MoE(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=fe),
                   hidden_size=h, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=fe)
    parts = activation_bytes_per_token(model, Layout(), True, moe_load_imbalance=1.0)
    assert parts.kept("none") * seq == pytest.approx(measured, rel=1e-9)


def test_compiled_cross_entropy_keeps_only_the_bf16_logits() -> None:
    """torchtitan's compiled loss (torch.compile of cross_entropy(pred.float())): what its
    forward saves, measured on real tensors; the peak adds the bf16 gradient it writes."""
    import shutil

    import torch.nn.functional as F

    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("torch.compile's CPU backend needs a C++ compiler (c++ or g++ on PATH)")

    def loss_fn(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    tokens, vocab = 256, 2048
    pred = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    compiled = torch.compile(loss_fn)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(pred, labels)
    entries = tokens * vocab
    big = sum(n for n in saved.values() if n >= entries)  # the per-entry tensors
    assert big == 2 * entries  # the bf16 logits, no fp32 copy
    loss.backward()
    assert pred.grad is not None and pred.grad.dtype == torch.bfloat16
    assert (big + pred.grad.nbytes) / entries == COMPILED_LOSS_PEAK_BYTES_PER_ENTRY
