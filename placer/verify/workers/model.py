"""Train the candidate's real model for a few steps, with its layout, on every rank (torchrun).

Usage: ``model.py CONFIG.json OUT_DIR``. CONFIG (placer/verify/realmodel.py writes it) gives
the model's shape, the layout and the job; the groups come from the candidate's rank map through
placer_mesh, as in the replay. Plain PyTorch, random weights, random tokens:

- a Llama-style decoder written eagerly (RMSNorm, q/k/v/o projections, GQA attention through
  ``scaled_dot_product_attention``, gated SiLU or GELU MLP, optionally top-k MoE layers), bf16
  weights, fp32 cross-entropy;
- TP: ``parallelize_module`` (column-wise q/k/v/w1/w3, row-wise o/w2, vocab-parallel embedding
  and output with ``loss_parallel``), on the mesh's ``tp`` dimension;
- PP: ``torch.distributed.pipelining`` stages of the plan's split (one per virtual stage, looped
  over the ranks), ``Schedule1F1B``, ``ScheduleInterleaved1F1B`` or ``ScheduleGPipe``;
- ZeRO-3: FSDP2 ``fully_shard`` per layer, the embedding and the output, on the dp x cp group;
  no ZeRO: gradients all-reduced over dp x cp after the last micro-batch;
- CP: each rank attends with its chunk of queries to the K/V all-gathered over ``cp`` (the
  all-gather form of context parallelism, Llama 3, arXiv:2407.21783 section 3.3.2);
- EP: tokens go to their experts' ranks and back with autograd-aware ``all_to_all_single``;
- the optimizer is the job's: weights in ``param_bytes``, fp32 main gradients accumulated by
  a post-accumulate hook, fp32 master weights and AdamW moments (Megatron's bf16 recipe).

Each rank writes ``OUT_DIR/rank<r>.json``: step times (its own and the slowest rank's), tokens
per step, and peak memory: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` on GPUs,
live tensor bytes on CPU (workers/livebytes.py). A CUDA out-of-memory error is written as
``"oom": true`` with the memory at that point, and the rank exits with code 3.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from placer.verify.workers.common import (
    barrier,
    max_over,
    mesh_from_config,
    synchronize,
    write_json,
)
from placer.verify.workers.livebytes import LiveBytes

OOM_EXIT_CODE = 3
DTYPES = {2: torch.bfloat16, 4: torch.float32}
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
LEARNING_RATE = 1e-4


# ------------------------------------------------------------------ the model


class Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any], cp: Any) -> None:
        super().__init__()
        h, d = cfg["hidden_size"], cfg["head_dim"]
        self.d, self.cp = d, cp
        self.wq = nn.Linear(h, cfg["heads"] * d, bias=False)
        self.wk = nn.Linear(h, cfg["kv_heads"] * d, bias=False)
        self.wv = nn.Linear(h, cfg["kv_heads"] * d, bias=False)
        self.wo = nn.Linear(cfg["heads"] * d, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.d).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.d).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.d).transpose(1, 2)
        if self.cp is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 enable_gqa=k.shape[1] != q.shape[1])
        else:
            out = self.cp.attend(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class ContextParallel:
    """Queries of this rank's sequence chunk against K/V all-gathered over the cp group."""

    def __init__(self, group: dist.ProcessGroup, rank_in_group: int, size: int) -> None:
        self.group, self.index, self.size = group, rank_in_group, size

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from torch.distributed.nn.functional import all_gather

        keys = torch.cat(all_gather(k.contiguous(), group=self.group), dim=2)
        values = torch.cat(all_gather(v.contiguous(), group=self.group), dim=2)
        s = q.shape[2]
        # Chunk i holds positions [i s, (i + 1) s): keys after a query's position are masked.
        rows = torch.arange(s, device=q.device) + self.index * s
        cols = torch.arange(s * self.size, device=q.device)
        mask = cols[None, :] <= rows[:, None]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                              enable_gqa=k.shape[1] != q.shape[1])


class MLP(nn.Module):
    def __init__(self, h: int, ffn: int, gated: bool) -> None:
        super().__init__()
        self.gated = gated
        self.w1 = nn.Linear(h, ffn, bias=False)
        self.w3 = nn.Linear(h, ffn, bias=False) if gated else None
        self.w2 = nn.Linear(ffn, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Top-k routed experts; this rank holds ``experts / ep`` of them (stacked weights)."""

    def __init__(self, cfg: dict[str, Any], ep_group: dist.ProcessGroup | None, ep: int) -> None:
        super().__init__()
        moe = cfg["moe"]
        h, f = cfg["hidden_size"], moe["expert_ffn_hidden_size"]
        self.experts, self.top_k, self.ep, self.group = moe["num_experts"], moe["top_k"], ep, \
            ep_group
        self.local = self.experts // ep
        self.gated = cfg["gated_mlp"]
        self.router = nn.Linear(h, self.experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(self.local, h, f))
        self.w3 = nn.Parameter(torch.empty(self.local, h, f)) if self.gated else None
        self.w2 = nn.Parameter(torch.empty(self.local, f, h))
        for w in (self.w1, self.w3, self.w2):
            if w is not None:
                nn.init.normal_(w, std=0.02)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        inner = x @ self.w1[e]
        inner = F.silu(inner) * (x @ self.w3[e]) if self.w3 is not None else F.gelu(inner)
        return inner @ self.w2[e]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.nn.functional import all_to_all_single

        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs = torch.softmax(self.router(tokens).float(), dim=-1)
        weight, chosen = torch.topk(probs, self.top_k, dim=-1)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        source = order // self.top_k
        routed = tokens[source] * weight.reshape(-1)[order, None].to(tokens.dtype)
        per_expert = torch.bincount(flat, minlength=self.experts)
        if self.ep > 1:
            send = per_expert.view(self.ep, self.local)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=self.group)
            in_splits = send.sum(1).tolist()
            out_splits = recv.sum(1).tolist()
            out = torch.empty(sum(out_splits), shape[-1], dtype=x.dtype, device=x.device)
            arrived = all_to_all_single(out, routed, out_splits, in_splits, group=self.group)
            # Arrivals are grouped by source rank, then expert: regroup by local expert.
            expert_of = torch.repeat_interleave(
                torch.arange(self.local, device=x.device).repeat(self.ep), recv.reshape(-1))
            regroup = torch.argsort(expert_of, stable=True)
            counts = recv.sum(0).tolist()
            worked = self._run(arrived[regroup], counts)
            back = torch.empty_like(worked)
            back[regroup] = worked
            result = torch.empty(len(order), shape[-1], dtype=x.dtype, device=x.device)
            returned = all_to_all_single(result, back, in_splits, out_splits, group=self.group)
        else:
            returned = self._run(routed, per_expert.tolist())
        combined = torch.zeros_like(tokens).index_add(0, source, returned)
        return combined.view(shape)

    def _run(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        outs, start = [], 0
        for e, n in enumerate(counts):
            outs.append(self._expert(e, x[start:start + n]))
            start += n
        return torch.cat(outs) if outs else x


class Block(nn.Module):
    def __init__(self, cfg: dict[str, Any], moe_layer: bool, cp: Any,
                 ep_group: dist.ProcessGroup | None, ep: int) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.attention_norm = nn.RMSNorm(h, eps=1e-5)
        self.attention = Attention(cfg, cp)
        self.ffn_norm = nn.RMSNorm(h, eps=1e-5)
        self.moe_layer = moe_layer
        self.feed_forward: nn.Module = (MoE(cfg, ep_group, ep) if moe_layer else
                                        MLP(h, cfg["ffn_hidden_size"], cfg["gated_mlp"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Part(nn.Module):
    """One virtual pipeline stage (the whole model without PP): embedding on the first, final
    norm and output layer on the last."""

    def __init__(self, cfg: dict[str, Any], layers: list[int], first: bool, last: bool,
                 cp: Any, ep_group: dist.ProcessGroup | None, ep: int) -> None:
        super().__init__()
        h, vocab = cfg["hidden_size"], cfg["vocab_size"]
        self.tok_embeddings = nn.Embedding(vocab, h) if first else None
        self.layers = nn.ModuleDict({str(i): Block(cfg, i in cfg["moe_layers"], cp, ep_group, ep)
                                     for i in layers})
        self.norm = nn.RMSNorm(h, eps=1e-5) if last else None
        self.output = nn.Linear(h, vocab, bias=False) if last else None
        if first and last and cfg["tied_embeddings"]:
            assert self.output is not None and self.tok_embeddings is not None
            self.output.weight = self.tok_embeddings.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            x = self.tok_embeddings(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.norm is not None and self.output is not None:
            x = self.output(self.norm(x))
        return x


# ------------------------------------------------------------------ parallelism


def apply_tp(part: Part, mesh: Any, sequence_parallel: bool) -> None:
    """Megatron-style TP with DTensor: column-wise in, row-wise out, vocab-parallel ends."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan: dict[str, Any] = {}
    if part.tok_embeddings is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate())
    if part.output is not None:
        plan["output"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    parallelize_module(part, mesh, plan)
    for block in part.layers.values():
        layer_plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel()}
        if not block.moe_layer:
            layer_plan.update({"feed_forward.w1": ColwiseParallel(),
                               "feed_forward.w2": RowwiseParallel()})
            if block.feed_forward.w3 is not None:
                layer_plan["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(block, mesh, layer_plan)
    del sequence_parallel  # the session refuses sp=on before launching


def apply_fsdp(part: Part, mesh: Any) -> None:
    """FSDP2: a unit per layer, for the embedding and for the output (torchtitan's units)."""
    from torch.distributed.fsdp import fully_shard

    for block in part.layers.values():
        fully_shard(block, mesh=mesh)
    if part.tok_embeddings is not None:
        fully_shard(part.tok_embeddings, mesh=mesh)
    if part.output is not None and part.norm is not None:
        fully_shard([part.norm, part.output], mesh=mesh)
    fully_shard(part, mesh=mesh)


class MixedPrecisionAdam:
    """The job's optimizer state: fp32 main gradients (filled by a hook as autograd finishes
    each parameter), fp32 master weights, AdamW moments; weights copied back each step."""

    def __init__(self, params: list[nn.Parameter], grad_dtype: torch.dtype,
                 master: bool) -> None:
        self.params = params
        self.state = []
        for p in params:
            main = torch.zeros_like(p, dtype=grad_dtype)
            copy = p.detach().to(torch.float32, copy=True) if master else None
            moments = (torch.zeros_like(p, dtype=torch.float32),
                       torch.zeros_like(p, dtype=torch.float32))
            self.state.append((main, copy, moments))
            p.register_post_accumulate_grad_hook(self._accumulate(main))
        self.steps = 0

    @staticmethod
    def _accumulate(main: torch.Tensor) -> Any:
        def hook(p: torch.Tensor) -> None:
            if p.grad is not None:
                main.add_(p.grad)
                p.grad = None
        return hook

    def mains(self) -> list[torch.Tensor]:
        return [main for main, _, _ in self.state]

    def sweep(self) -> None:
        """Gradients FSDP2 set without running the hook (after its reduce-scatter)."""
        for p, (main, _, _) in zip(self.params, self.state, strict=True):
            if p.grad is not None:
                main.add_(p.grad)
                p.grad = None

    def step(self) -> None:
        self.steps += 1
        b1, b2 = ADAM_BETAS
        fix1, fix2 = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        with torch.no_grad():
            for p, (main, copy, (m, v)) in zip(self.params, self.state, strict=True):
                target = copy if copy is not None else p
                g = main.float() if main.dtype != torch.float32 else main
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                target.mul_(1 - LEARNING_RATE * 0.1)
                target.addcdiv_(m, (v / fix2).sqrt_().add_(ADAM_EPS), value=-LEARNING_RATE / fix1)
                if copy is not None:
                    p.copy_(copy)
                main.zero_()


# ------------------------------------------------------------------ one rank


def _group_info(pm: Any, dim: str) -> tuple[dist.ProcessGroup | None, int, int]:
    if dim not in pm.dims:
        return None, 0, 1
    ranks = pm.group_ranks(dim)
    return pm.group(dim), ranks.index(pm.rank), len(ranks)


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def build(config: dict[str, Any], pm: Any) -> tuple[list[Part], list[int], Any]:
    """This rank's parts (virtual stages), their stage indices, and the sharding context."""
    cfg, layout = config["model"], config["layout"]
    pp, vpp = layout["pp"], layout["vpp"]
    stage = pm.coords.get("pp", 0)
    cp_group, cp_index, cp_size = _group_info(pm, "cp")
    cp = ContextParallel(cp_group, cp_index, cp_size) if cp_size > 1 and cp_group else None
    ep_group, _, ep_size = _group_info(pm, "ep")
    chunks: list[int] = config["chunks"]
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    indices = [stage + k * pp for k in range(vpp)] if pp > 1 else [0]
    parts = []
    for index in indices:
        layers = list(range(starts[index], starts[index] + chunks[index])) if pp > 1 else \
            list(range(cfg["num_layers"]))
        parts.append(Part(cfg, layers, index == 0, index == len(chunks) - 1 or pp == 1, cp,
                          ep_group, ep_size))
    return parts, indices, (cp_index, cp_size)


def main() -> None:  # noqa: PLR0915 - one linear script: build, parallelise, run, report
    config = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(sys.argv[2])
    pm = mesh_from_config(config)
    device = pm.device
    cfg, layout = config["model"], config["layout"]
    torch.manual_seed(1234 + pm.coords.get("pp", 0))
    tracker = LiveBytes(config.get("device_memory_bytes")) if device.type == "cpu" else None
    record: dict[str, Any] = {"rank": pm.rank, "stage": pm.coords.get("pp", 0), "oom": False,
                              "step_local_s": [], "step_max_s": [],
                              "device": device.type}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        if tracker is not None:
            tracker.__enter__()
        run(config, cfg, layout, pm, device, record, tracker)
    except torch.OutOfMemoryError as exc:
        record["oom"] = True
        record["error"] = str(exc).splitlines()[0]
    finally:
        if tracker is not None and tracker.active:
            tracker.__exit__(None, None, None)
    if device.type == "cuda":
        record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    elif tracker is not None:
        record["peak_allocated_bytes"] = tracker.peak_bytes
        record["peak_reserved_bytes"] = None
    write_json(out_dir / f"rank{pm.rank}.json", record)
    if record["oom"]:
        sys.stdout.flush()
        os._exit(OOM_EXIT_CODE)  # the other ranks wait in a collective; torchrun ends them
    pm.destroy()


def run(config: dict[str, Any], cfg: dict[str, Any], layout: dict[str, Any], pm: Any,
        device: torch.device, record: dict[str, Any], tracker: LiveBytes | None) -> None:
    """Build, then train; on CPU the tracker counts the build and the first step (the peak:
    all optimizer state exists from the start) and is off for the later, timed steps, whose
    Python dispatch it would slow down."""
    param_dtype = DTYPES[config["optimizer"]["param_bytes"]]
    grad_dtype = DTYPES[config["optimizer"]["grad_bytes"]]
    with torch.device(device):
        parts, indices, (cp_index, cp_size) = build(config, pm)
    for part in parts:
        part.to(param_dtype)
        if layout["tp"] > 1:
            apply_tp(part, pm.mesh["tp"], layout["sequence_parallel"])
        if layout["zero_stage"] >= 3 and layout["dp"] * layout["cp"] > 1:
            apply_fsdp(part, _dp_mesh(pm, layout))
    params = [p for part in parts for p in part.parameters()]
    opt = MixedPrecisionAdam(params, grad_dtype, config["optimizer"]["master_param_bytes"] > 0)
    record["static_bytes"] = _memory_now(device)  # weights and optimizer state, before a step
    mbs, seq = layout["micro_batch_size"], config["seq_len"]
    local_seq = seq // cp_size
    m = config["microbatches"]
    vocab = cfg["vocab_size"]
    schedule = _schedule(config, parts, indices, pm, device) if layout["pp"] > 1 else None
    # Without FSDP: dense gradients are summed over dp x cp, expert ones over expert-dp.
    dense_group = _dp_group(pm, ("dp_cp", "dp")) if layout["zero_stage"] < 3 else None
    expert_group = _dp_group(pm, ("edp",)) if layout["zero_stage"] < 3 else None
    expert_params = {id(p) for part in parts for block in part.layers.values()
                     if isinstance(block.feed_forward, MoE)
                     for p in (block.feed_forward.w1, block.feed_forward.w2,
                               block.feed_forward.w3) if p is not None}
    reduce_groups = [expert_group if id(p) in expert_params else dense_group for p in params]
    generator = torch.Generator(device="cpu").manual_seed(99 + cp_index)
    for step in range(config["warmup_steps"] + config["steps"]):
        tokens = torch.randint(0, vocab, (m * mbs, local_seq), generator=generator).to(device)
        labels = torch.randint(0, vocab, (m * mbs, local_seq), generator=generator).to(device)
        barrier(None, device)
        start = time.perf_counter()
        if schedule is not None:
            with _loss_context(layout["tp"]):
                schedule.step(tokens, target=labels, return_outputs=False)
        else:
            for k in range(m):
                chunk = slice(k * mbs, (k + 1) * mbs)
                with _loss_context(layout["tp"]):
                    loss = _loss(parts[0](tokens[chunk]), labels[chunk]) / m
                    loss.backward()
        opt.sweep()
        for main, group in zip(opt.mains(), reduce_groups, strict=True):
            if group is not None:
                dist.all_reduce(_local_of(main), group=group)
        opt.step()
        synchronize(device)
        local = time.perf_counter() - start
        slowest = max_over(local, None, device)
        if step >= config["warmup_steps"]:
            record["step_local_s"].append(local)
            record["step_max_s"].append(slowest)
        if tracker is not None and tracker.active and step + 1 < config["warmup_steps"] + \
                config["steps"]:
            tracker.__exit__(None, None, None)
            record["memory_tracked_steps"] = step + 1
    record["tokens_per_step"] = config["tokens_per_step"]


def _memory_now(device: torch.device) -> int:
    """Bytes of live tensors now: the allocator's count on GPUs, the tracker's on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    trackers = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, LiveBytes)]
    return trackers[-1].live_bytes if trackers else 0


def _local_of(tensor: torch.Tensor) -> torch.Tensor:
    inner = getattr(tensor, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else tensor


def _loss_context(tp: int) -> Any:
    """Vocab-parallel cross-entropy under TP: forward and backward both inside
    ``loss_parallel`` (DTensor's rule), so the logits are never gathered."""
    if tp == 1:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def _dp_mesh(pm: Any, layout: dict[str, Any]) -> Any:
    """The mesh FSDP2 shards over: dp, or dp and cp flattened (ZeRO shards over both)."""
    if layout["cp"] > 1 and layout["dp"] > 1:
        return pm.mesh["dp", "cp"]._flatten("dp_cp")
    return pm.mesh["cp" if layout["cp"] > 1 else "dp"]


def _dp_group(pm: Any, names: tuple[str, ...]) -> dist.ProcessGroup | None:
    for name in names:
        if name in pm.dims and len(pm.group_ranks(name)) > 1:
            return pm.group(name)
    return None


def _schedule(config: dict[str, Any], parts: list[Part], indices: list[int], pm: Any,
              device: torch.device) -> Any:
    from torch.distributed import pipelining

    layout = config["layout"]
    group = pm.group("pp")
    stages = [pipelining.PipelineStage(part, index, len(config["chunks"]), device, group=group)
              for part, index in zip(parts, indices, strict=True)]
    m = config["microbatches"]
    if layout["vpp"] > 1:
        return pipelining.ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=_loss)
    kind = pipelining.ScheduleGPipe if config["schedule"] == "gpipe" else pipelining.Schedule1F1B
    return kind(stages[0], n_microbatches=m, loss_fn=_loss)


if __name__ == "__main__":
    main()
