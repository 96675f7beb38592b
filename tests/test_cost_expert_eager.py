"""Megatron-Core TEGroupedMLP's eager expert ops (compute.eager_expert_bytes).

The per-column byte constants are checked against the aten ops the same PyTorch steps dispatch
(what each op reads and writes; views free): the clamped GLU's chunk / clamp / cat
(megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl) and the fc2 bias scaled
by the routing probability, added per expert and concatenated (moe/experts.py
TEGroupedMLP._apply_bias), forward and backward, in bf16.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from placer.cost import compute
from placer.cost.options import CostOptions
from placer.cost.profile import HBM_EFFICIENCY, calibration_for
from placer.cost.stack_options import options_for
from placer.spec.job import Job
from placer.spec.presets import load_cluster, load_model
from placer.spec.stack import load_stack

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accuracy  # noqa: E402


class _Traffic(TorchDispatchMode):
    """Bytes every non-aliasing aten op reads (tensor inputs) and writes (tensor outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not any(r.alias_info is not None for r in func._schema.returns):
            tensors = [t for t in tree_flatten((args, kwargs, out))[0]
                       if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _measured(copies: int, ffn: int, hidden: int, experts: int = 2) -> tuple[float, ...]:
    """(clamp forward, clamp backward, bias forward, bias backward) bytes per routed copy."""
    bf16 = torch.bfloat16
    fc1 = torch.randn(copies, 2 * ffn, dtype=bf16, requires_grad=True)
    fc2 = torch.randn(copies, hidden, dtype=bf16, requires_grad=True)
    probs = torch.rand(copies, 1, dtype=bf16, requires_grad=True)
    biases = [torch.randn(hidden, dtype=bf16, requires_grad=True) for _ in range(experts)]
    rows = [copies // experts] * experts
    with _Traffic() as clamp_fwd:
        glu, lin = fc1.chunk(2, -1)
        clamped = torch.cat((glu.clamp(max=7.0), lin.clamp(min=-7.0, max=7.0)), -1)
    with _Traffic() as bias_fwd:
        parts = zip(torch.split(fc2, rows), biases, torch.split(probs, rows), strict=True)
        biased = torch.cat([t + b * p for t, b, p in parts])
    grad_biased, grad_clamped = torch.randn_like(biased), torch.randn_like(clamped)
    with _Traffic() as bias_bwd:
        biased.backward(grad_biased)
    with _Traffic() as clamp_bwd:
        clamped.backward(grad_clamped)
    return tuple(m.bytes / copies for m in (clamp_fwd, clamp_bwd, bias_fwd, bias_bwd))


def test_constants_match_the_ops_traffic() -> None:
    ffn, hidden = 512, 256
    clamp_fwd, clamp_bwd, bias_fwd, bias_bwd = _measured(4096, ffn, hidden)
    assert clamp_fwd / ffn == pytest.approx(compute.EAGER_CLAMP_FORWARD_BYTES, rel=0.01)
    assert clamp_bwd / ffn == pytest.approx(compute.EAGER_CLAMP_BACKWARD_BYTES, rel=0.01)
    assert bias_fwd / hidden == pytest.approx(compute.EAGER_BIAS_FORWARD_BYTES, rel=0.01)
    assert bias_bwd / hidden == pytest.approx(compute.EAGER_BIAS_BACKWARD_BYTES, rel=0.01)


def test_gpt_oss_bytes_by_hand() -> None:
    model = load_model("gpt-oss-120b")
    on = CostOptions(moe_eager_expert_ops=True)
    # 2880-wide experts and hidden: forward (16 + 12) x 2880, backward (27 + 16) x 2880, and the
    # clamp again under moe_act recompute, per routed copy.
    assert compute.eager_expert_bytes(model, 2880.0, 10.0, on) == (
        10 * 28 * 2880, 10 * 43 * 2880, 10 * 16 * 2880)
    assert compute.eager_expert_bytes(model, 2880.0, 10.0, CostOptions()) == (0.0, 0.0, 0.0)
    # No clamp, no biases (Qwen3): nothing, even with the option on.
    qwen = load_model("qwen3-30b-a3b")
    assert compute.eager_expert_bytes(qwen, 768.0, 10.0, on) == (0.0, 0.0, 0.0)


def test_pass_times_charge_the_bytes_at_hbm_rate() -> None:
    calib = calibration_for(load_cluster("dgx-h100"))
    work = compute.LayerWork(gemms=(), attention_flops=0.0, elementwise_bytes=1.0,
                             module_bytes=(("moe_act", 0.0),))
    eager = dataclasses.replace(work, eager_expert_bytes=(3e9, 5e9, 2e9))
    rate = calib.hbm_bytes_per_s * HBM_EFFICIENCY
    base = compute._pass_times(work, calib, "bf16", "selective", modules=("moe_act",))
    more = compute._pass_times(eager, calib, "bf16", "selective", modules=("moe_act",))
    assert more.forward_s - base.forward_s == pytest.approx(3e9 / rate)
    assert more.backward_s - base.backward_s == pytest.approx(5e9 / rate)
    assert more.recompute_s - base.recompute_s == pytest.approx(2e9 / rate)


def _record(precision: str, source: str = "MBRIDGE_2608") -> dict[str, Any]:
    return {"source_id": source, "precision": precision, "model": {"name": "GPT OSS 120B"}}


def test_bridge_bf16_rows_run_the_eager_ops() -> None:
    assert accuracy.bridge_eager_expert_ops(_record("BF16"))
    assert not accuracy.bridge_eager_expert_ops(_record("MXFP8"))
    assert not accuracy.bridge_eager_expert_ops(_record("BF16", source="AUTOMODEL_2604"))


def test_megatron_stack_prices_the_eager_expert_ops_and_the_others_do_not() -> None:
    """recommend-layout on the megatron-core stack runs Megatron-Core's TEGroupedMLP (TE op fuser
    off by default): a GPT-OSS layout pays the clamp and bias traffic there, not on torchtitan.
    """
    job = Job(seq_len=4096, global_batch_size=64)
    assert options_for(job, load_stack("megatron-core")).moe_eager_expert_ops
    assert not options_for(job, load_stack("torchtitan")).moe_eager_expert_ops
    assert not options_for(job, None).moe_eager_expert_ops
