"""Reference PyTorch transformer blocks whose memory the tests measure (test helpers, CPU).

Two kernel styles of the same Llama block (RMSNorm, RoPE, GQA attention through
``F.scaled_dot_product_attention``, SwiGLU MLP), both in bf16:

* ``fused`` follows Megatron-Core with Transformer Engine: fused QKV projection, a fused RMSNorm
  that saves its input and fp32 rstd, SwiGLU with gate and up fused that saves only its input
  (``bias_swiglu_impl``), contiguous q, k and v, hidden dropout before each residual add; with
  sequence parallelism the column-parallel linears save the local sequence shard and all-gather
  it again in backward (``LinearWithGradAccumulationAndAsyncCommunication``).
* ``eager`` follows torchtitan's Llama 3 model (torchtitan/models/llama3/model/model.py at
  018740b7aae7846d24954539244c78215dbd181f): separate wq/wk/wv, complex RoPE in fp32,
  ``repeat_kv`` materialising K and V at the query heads, ``silu(w1 x) * w3 x``, ``nn.RMSNorm``
  (on CUDA ``F.rms_norm`` dispatches ``aten._fused_rms_norm``, which saves input and rstd; on CPU
  it decomposes, so the fused op and its backward are called explicitly), no dropout; with
  sequence parallelism DTensor's all-gather output is what the linears save.

Tensor parallelism is emulated with one rank's shapes: local heads and FFN columns, collectives
replaced by shape-equivalent local ops that save nothing (an all-gather is a repeat, a
reduce-scatter keeps one sequence shard). The MoE block routes with an fp32 softmax and top-k,
permutes the token copies by expert, runs each expert's SwiGLU MLP on its rows and sums the
probability-weighted outputs back (Megatron-Core's permutation on one rank, ep = 1).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

BF16 = torch.bfloat16
EPS = 1e-5
aten = torch.ops.aten


@dataclass(frozen=True)
class BlockShape:
    """One block's sizes and how it runs (one tensor-parallel rank's view)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    tp: int = 1
    sp: bool = False
    fused: bool = True
    hidden_dropout: float = 0.0
    experts: int = 0  # > 0: an MoE block of this many experts, each of ``ffn`` columns
    top_k: int = 1


class _FusedRMSNorm(torch.autograd.Function):
    """``aten._fused_rms_norm`` with the autograd formula CUDA uses: saves input, rstd, weight."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y, rstd = aten._fused_rms_norm(x, [x.shape[-1]], weight, EPS)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, rstd, weight = ctx.saved_tensors
        gx, gw = aten._fused_rms_norm_backward(grad, x, [x.shape[-1]], rstd, weight,
                                               [True, True])
        return gx, gw


class _FusedSwiGLU(torch.autograd.Function):
    """Megatron's fused SwiGLU: saves only its input (gate and up side by side)."""

    @staticmethod
    def forward(ctx: Any, gate_up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (gate_up,) = ctx.saved_tensors
        gate, up = gate_up.float().chunk(2, dim=-1)
        sig = torch.sigmoid(gate)
        g = grad.float()
        d_gate = g * up * sig * (1 + gate * (1 - sig))
        return torch.cat([d_gate, g * gate * sig], dim=-1).to(gate_up.dtype)


class _WeightedSwiGLU(torch.autograd.Function):
    """Megatron's ``weighted_bias_swiglu_impl``: saves its input and the fp32 probabilities."""

    @staticmethod
    def forward(ctx: Any, gate_up: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate_up, probs)
        gate, up = gate_up.chunk(2, dim=-1)
        return (F.silu(gate) * up * probs.unsqueeze(-1)).to(gate_up.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate_up, probs = ctx.saved_tensors
        gate, up = gate_up.float().chunk(2, dim=-1)
        act = F.silu(gate) * up
        sig = torch.sigmoid(gate)
        g = grad.float() * probs.unsqueeze(-1)
        d_gate = g * up * sig * (1 + gate * (1 - sig))
        d_probs = (grad.float() * act).sum(-1)
        return torch.cat([d_gate, g * F.silu(gate)], dim=-1).to(gate_up.dtype), d_probs


class _AllGather(torch.autograd.Function):
    """All-gather along the sequence (one rank's view: a repeat); saves nothing."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ways: int) -> torch.Tensor:
        ctx.ways = ways
        return x.repeat(1, ways, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        b, s, h = grad.shape
        return grad.view(b, ctx.ways, s // ctx.ways, h).sum(1), None


class _ReduceScatter(torch.autograd.Function):
    """Reduce-scatter along the sequence (one rank's view: keep one shard); saves nothing."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ways: int) -> torch.Tensor:
        ctx.ways = ways
        return x[:, : x.shape[1] // ways].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.repeat(1, ctx.ways, 1), None


class _GatheredLinear(torch.autograd.Function):
    """Megatron's column-parallel linear under SP: saves the local shard, re-gathers in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, ways: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.ways = ways
        return F.linear(x.repeat(1, ways, 1), weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight = ctx.saved_tensors
        total = x.repeat(1, ctx.ways, 1)
        grad_w = grad.flatten(0, 1).t() @ total.flatten(0, 1)
        b, s, _ = grad.shape
        grad_x = (grad @ weight).view(b, ctx.ways, s // ctx.ways, -1).sum(1)
        return grad_x, grad_w, None


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape, dtype=BF16) * 0.02)


class Block(nn.Module):
    """One transformer layer on one TP rank; input and output are (batch, seq / sp, hidden)."""

    def __init__(self, shape: BlockShape, seq: int) -> None:
        super().__init__()
        self.shape = shape
        t = shape.tp
        self.local_heads = shape.heads // t
        self.local_kv = max(shape.kv_heads // t, 1)
        d, h = shape.head_dim, shape.hidden
        self.norm1 = nn.Parameter(torch.ones(h, dtype=BF16))
        self.norm2 = nn.Parameter(torch.ones(h, dtype=BF16))
        qkv = (self.local_heads * d, self.local_kv * d, self.local_kv * d)
        ffn = shape.ffn // t
        experts = max(shape.experts, 1)
        if shape.fused:  # one QKV and one gate+up weight, as Megatron stores them
            self.wqkv = nn.ParameterList([_param(sum(qkv), h)])
            self.w13 = nn.ParameterList([_param(2 * ffn, h) for _ in range(experts)])
        else:
            self.wqkv = nn.ParameterList([_param(n, h) for n in qkv])
            self.w13 = nn.ParameterList([_param(ffn, h) for _ in range(2 * experts)])
        self.qkv_sizes = qkv
        self.wo = _param(h, self.local_heads * d)
        self.w2 = nn.ParameterList([_param(h, ffn) for _ in range(experts)])
        if shape.experts:
            self.router = _param(shape.experts, h)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32),
                             torch.rand(d // 2, dtype=torch.float32))
        self.register_buffer("freqs", torch.polar(torch.ones_like(angles), angles))
        # In eager-mode SDPA's backward the causal mask is implicit; nothing else is cached.

    # -- pieces --
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _FusedRMSNorm.apply(x, weight)

    def _column(self, x: torch.Tensor, weights: nn.ParameterList,
                sizes: tuple[int, ...]) -> list[torch.Tensor]:
        """Column-parallel linears of one input: Megatron saves the shard, DTensor the gather."""
        s = self.shape
        if s.fused:
            (w,) = weights
            out = _GatheredLinear.apply(x, w, s.tp) if s.sp else F.linear(x, w)
            return list(out.split(list(sizes), dim=-1))
        full = _AllGather.apply(x, s.tp) if s.sp else x
        return [F.linear(full, w) for w in weights]

    def _row(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, weight)
        return _ReduceScatter.apply(out, self.shape.tp) if self.shape.sp else out

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        b, s, n, d = x.shape
        pairs = torch.view_as_complex(x.float().reshape(b, s, n, d // 2, 2))
        rotated = torch.view_as_real(pairs * self.freqs[:s].view(1, s, 1, d // 2)).flatten(3)
        return rotated.type_as(x)

    def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(b, s, heads, d) in; (b, s, heads * d) out."""
        b, s = q.shape[:2]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True,
                                             enable_gqa=q.shape[2] != k.shape[2])
        out = out.transpose(1, 2)
        return (out if self.shape.fused else out.contiguous()).reshape(b, s, -1)

    def attention(self, x: torch.Tensor, attn: Callable[..., torch.Tensor]) -> torch.Tensor:
        s = self.shape
        n = self._norm(x, self.norm1)
        q, k, v = self._column(n, self.wqkv, self.qkv_sizes)
        b, seq = q.shape[:2]
        q = self._rope(q.view(b, seq, self.local_heads, s.head_dim))
        k = self._rope(k.view(b, seq, self.local_kv, s.head_dim))
        v = v.view(b, seq, self.local_kv, s.head_dim)
        if s.fused:
            v = v.contiguous()
        else:  # torchtitan's repeat_kv
            rep = self.local_heads // self.local_kv
            k = k.unsqueeze(3).expand(b, seq, self.local_kv, rep, s.head_dim).reshape(
                b, seq, self.local_heads, s.head_dim)
            v = v.unsqueeze(3).expand(b, seq, self.local_kv, rep, s.head_dim).reshape(
                b, seq, self.local_heads, s.head_dim)
        out = self._row(attn(q, k, v), self.wo)
        return self._residual(x, out)

    def _residual(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.shape.hidden_dropout:  # CUDA's fused dropout: a bool mask (CPU's keeps bf16)
            out, _ = torch.native_dropout(out, self.shape.hidden_dropout, True)
        return x + out

    def _expert(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if self.shape.fused:
            return F.linear(_FusedSwiGLU.apply(F.linear(x, self.w13[i])), self.w2[i])
        gate, up = F.linear(x, self.w13[2 * i]), F.linear(x, self.w13[2 * i + 1])
        return F.linear(F.silu(gate) * up, self.w2[i])

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shape
        n = self._norm(x, self.norm2)
        if not s.experts:
            ffn = s.ffn // s.tp
            if s.fused:
                (gate_up,) = self._column(n, self.w13, (2 * ffn,))
                act = _FusedSwiGLU.apply(gate_up)
            else:
                g, u = self._column(n, self.w13, (ffn, ffn))
                act = F.silu(g) * u
            return self._residual(x, self._row(act, self.w2[0]))
        return self._residual(x, self._moe(n))

    def _moe(self, n: torch.Tensor) -> torch.Tensor:
        """Megatron-Core's router and permutation on one rank (moe/router.py, moe/moe_utils.py):
        fp32 softmax, top-k scattered into a routing map, tokens permuted by sorted indices,
        probabilities applied inside the expert activation, outputs summed back by index."""
        s = self.shape
        b, seq, h = n.shape
        tokens = n.reshape(b * seq, h)
        scores = torch.softmax(F.linear(tokens, self.router).float(), dim=-1)
        top_probs, top = torch.topk(scores, s.top_k, dim=-1)
        probs = torch.zeros_like(scores).scatter(1, top, top_probs)
        routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter(1, top, True)
        mask = routing_map.t().contiguous()
        sorted_indices = torch.arange(b * seq).expand(s.experts, -1).masked_select(mask)
        permuted = tokens.index_select(0, sorted_indices)
        permuted_probs = probs.t().contiguous().masked_select(mask)
        per_expert = mask.sum(1).tolist()
        outputs = []
        for i, (rows, p) in enumerate(zip(permuted.split(per_expert), permuted_probs.split(
                per_expert), strict=True)):
            gate_up = F.linear(rows, self.w13[i])
            outputs.append(F.linear(_WeightedSwiGLU.apply(gate_up, p), self.w2[i]))
        index = sorted_indices.unsqueeze(1).expand(-1, h)
        combined = torch.zeros_like(tokens).scatter_add(0, index, torch.cat(outputs))
        return combined.view(b, seq, h)

    def forward(self, x: torch.Tensor, attn: Callable[..., torch.Tensor] | None = None
                ) -> torch.Tensor:
        return self.mlp(self.attention(x, attn or self.core_attention))


# ----- recomputation ----------------------------------------------------------------------------

def _op_sac_policy(counts: dict[str, int]) -> Callable[..., CheckpointPolicy]:
    """torchtitan's op-level selective AC (Dec 2024, parallelize_llama.py ``_save_list``):
    save the outputs of SDPA and of every other ``aten.mm`` (the 1st, 3rd, ...), recompute the
    rest."""
    save = {aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            counts[mode] += 1
            keep = counts[mode] % 2 == 1
        else:
            keep = func in save
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def _op_sac_context() -> tuple[Any, Any]:
    """A fresh op-level policy per checkpointed call, as torchtitan's context_fn makes one (its
    matmul count restarts); a module-level function, which torch.compile traces."""
    return create_selective_checkpoint_contexts(_op_sac_policy(defaultdict(int)))


def run_layer(block: Block, x: torch.Tensor, recompute: str) -> torch.Tensor:
    """One layer under a recompute mode: none, selective (Megatron core_attn), op, full."""
    if recompute == "full":
        return checkpoint(block, x, use_reentrant=False)
    if recompute == "selective":
        def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return checkpoint(block.core_attention, q, k, v, use_reentrant=False)
        return block(x, attn)
    if recompute == "op":
        return checkpoint(block, x, use_reentrant=False, context_fn=_op_sac_context)
    assert recompute == "none", recompute
    return block(x)


# ----- measuring --------------------------------------------------------------------------------

@contextlib.contextmanager
def saved_storages(exclude: set[int]) -> Iterator[dict[int, int]]:
    """Unique storages saved for backward inside the block (bytes by storage), not ``exclude``."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in exclude:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


def storage_ids(tensors: Any) -> set[int]:
    return {t.untyped_storage()._cdata for t in tensors}


def layer_input(shape: BlockShape, seq: int, batch: int = 1) -> torch.Tensor:
    local = seq // shape.tp if shape.sp else seq
    return torch.randn(batch, local, shape.hidden, dtype=BF16, requires_grad=True)


def kept_bytes(shape: BlockShape, seq: int, recompute: str, layers: int = 1) -> float:
    """Bytes a stack of ``layers`` blocks keeps from forward to backward (live-memory delta)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    blocks = [Block(shape, seq) for _ in range(layers)]
    x = layer_input(shape, seq)
    tracker = MemTracker()
    tracker.track_external(*blocks)
    with tracker:
        before = tracker.get_tracker_snapshot("current")
        out = x
        for block in blocks:
            out = run_layer(block, out, recompute)
        after = tracker.get_tracker_snapshot("current")
    device = torch.device("cpu")
    output = out.untyped_storage().nbytes()
    return after[device]["Total"] - before[device]["Total"] - output


def compiled_op_kept_bytes(shape: BlockShape, seq: int) -> float:
    """Bytes one layer under torchtitan's op-level checkpointing keeps for backward when it is
    torch.compile'd: the tensors the compiled forward saves (its backward node's saved
    tensors; unique storages, the layer input included, parameters and buffers not), traced by
    AOTAutograd with the min-cut partitioner Inductor uses (backend
    ``aot_eager_decomp_partition``: Inductor's decompositions and partitioner, eager kernels).
    Real tensors: a small ``shape``."""
    block = Block(shape, seq)
    x = layer_input(shape, seq)

    def layer(t: torch.Tensor) -> torch.Tensor:
        return checkpoint(block, t, use_reentrant=False, context_fn=_op_sac_context)

    torch._dynamo.reset()
    out = torch.compile(layer, backend="aot_eager_decomp_partition", fullgraph=True)(x)
    exclude = storage_ids([*block.parameters(), *block.buffers(), out])
    sizes: dict[int, int] = {}
    nodes, seen = [out.grad_fn], set()
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for t in getattr(node, "saved_tensors", ()):
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in exclude:
                sizes[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        nodes.extend(n for n, _ in node.next_functions)
    torch._dynamo.reset()
    return float(sum(sizes.values()))


def _drop_grads_as_formed(params: Iterable[nn.Parameter]) -> None:
    """Free each weight gradient once accumulated: the peaks measured are activations' only."""
    for p in params:
        p.register_post_accumulate_grad_hook(lambda q: setattr(q, "grad", None))


def _cpu_total(tracker: Any, kind: str) -> float:
    """MemTracker's ``kind`` ("current" or "peak") total on the CPU device."""
    return tracker.get_tracker_snapshot(kind)[torch.device("cpu")]["Total"]


def _run_blocks(blocks: list[Block], x: torch.Tensor, recompute: str) -> torch.Tensor:
    out = x
    for block in blocks:
        out = run_layer(block, out, recompute)
    return out


def peak_bytes(shape: BlockShape, seq: int, recompute: str, layers: int = 1) -> tuple[float, float]:
    """(kept after forward, peak above the start) of forward + backward of ``layers`` blocks."""
    from torch.distributed._tools.mem_tracker import MemTracker

    blocks = [Block(shape, seq) for _ in range(layers)]
    x = layer_input(shape, seq)
    _drop_grads_as_formed(q for block in blocks for q in block.parameters())
    tracker = MemTracker()
    tracker.track_external(*blocks)
    with tracker:
        start = _cpu_total(tracker, "current")
        out = _run_blocks(blocks, x, recompute)
        kept = _cpu_total(tracker, "current") - start
        out.float().sum().backward()
        peak = _cpu_total(tracker, "peak") - start
    return kept, peak


def loss_bytes(tokens: int, hidden: int, vocab: int) -> tuple[float, float]:
    """(kept after forward, peak) of the output layer and an fp32 cross-entropy, as torchtitan
    runs it: ``cross_entropy(logits.float())``, the bf16 logits freed before backward."""
    from torch.distributed._tools.mem_tracker import MemTracker

    x = torch.randn(tokens, hidden, dtype=BF16, requires_grad=True)
    weight = nn.Parameter(torch.randn(vocab, hidden, dtype=BF16))
    _drop_grads_as_formed([weight])
    labels = torch.randint(0, vocab, (tokens,))
    tracker = MemTracker()
    tracker.track_external(weight)
    with tracker:
        start = _cpu_total(tracker, "current")
        logits = F.linear(x, weight)
        loss = F.cross_entropy(logits.float(), labels)
        del logits
        kept = _cpu_total(tracker, "current") - start
        loss.backward()
        peak = _cpu_total(tracker, "peak") - start
    return kept, peak


def stack_loss_peak_bytes(shape: BlockShape, seq: int, vocab: int, recompute: str,
                          layers: int) -> float:
    """Peak above the start of forward + backward of ``layers`` blocks, the output layer and an
    fp32 cross-entropy as torchtitan runs it (``loss_bytes``), weight gradients dropped as they
    form: where the loss backward and the last layer's backward meet."""
    from torch.distributed._tools.mem_tracker import MemTracker

    blocks = [Block(shape, seq) for _ in range(layers)]
    weight = nn.Parameter(torch.randn(vocab, shape.hidden, dtype=BF16))
    _drop_grads_as_formed([weight, *(q for block in blocks for q in block.parameters())])
    x = layer_input(shape, seq)
    labels = torch.randint(0, vocab, (seq,))
    tracker = MemTracker()
    tracker.track_external(weight, *blocks)
    with tracker:
        start = _cpu_total(tracker, "current")
        out = _run_blocks(blocks, x, recompute)
        logits = F.linear(out.view(seq, shape.hidden), weight)
        loss = F.cross_entropy(logits.float(), labels)
        del logits, out
        loss.backward()
        return _cpu_total(tracker, "peak") - start
