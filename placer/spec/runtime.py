"""How the framework runs a job beyond the layout: overlaps, MoE dispatch, precision recipe.

Every field is optional: None takes the stack's default (``placer.spec.stack``), or placer's
generic default without a stack (placer.cost.options). The cost model prices each as a mechanism:
what hides behind which compute, what bytes move, what stays in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from placer.spec.base import Spec

Overlap = Literal["tp", "dp_grad", "param_gather", "cp", "ep", "p2p"]
"""Communication hidden behind compute:

- ``tp``: TP all-gather/reduce-scatter pipelined with the GEMM that consumes/produces it
  (Megatron ``--tp-comm-overlap`` with Transformer Engine userbuffers, torchtitan async TP); needs
  sequence parallelism;
- ``dp_grad``: bucketed gradient reduction behind the backward (``--overlap-grad-reduce``,
  FSDP2's per-layer reduce-scatter);
- ``param_gather``: the distributed optimizer's / FSDP's parameter all-gather prefetched behind
  the forward (``--overlap-param-gather``, FSDP2 prefetch);
- ``cp``: the context-parallel K/V ring exchange behind each attention block (TE's ring);
- ``ep``: the MoE all-to-all behind another micro-batch's compute (Megatron
  ``--overlap-moe-expert-parallel-comm``, DualPipe's F&B chunks);
- ``p2p``: pipeline stage sends behind the next chunk (``--overlap-p2p-communication``)."""
OVERLAPS: tuple[str, ...] = ("tp", "dp_grad", "param_gather", "cp", "ep", "p2p")
Dispatcher = Literal["alltoall", "allgather", "flex"]
"""MoE token dispatcher (Megatron-Core ``--moe-token-dispatcher-type``): ``alltoall`` sends each
routed copy to its expert's rank; ``allgather`` gathers every token of the EP group on every rank
and keeps its own experts' share; ``flex`` (DeepEP/HybridEP) sends a token once per destination
rank, not once per routed expert, and deduplicates on arrival."""
LAUNCH_EXPANDABLE_SEGMENTS = True
"""placer's launch env.sh exports PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(placer/launch/env.py), so a job that does not say how its launcher configures the allocator is
planned as placer launches it: without the caching allocator's fragmentation allowance."""
LAUNCH_ALLOC_CONF = "expandable_segments:True"
"""The PYTORCH_CUDA_ALLOC_CONF value env.sh exports when expandable segments are on."""
ALLOC_CONF_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
"""The caching allocator's settings variables, the one that wins first: c10/core/AllocatorConfig.h
(torch 2.13), which holds expandable_segments, names PYTORCH_ALLOC_CONF the primary variable and
PYTORCH_CUDA_ALLOC_CONF the older name it still reads "with lower priority"."""


def alloc_conf_expandable(env: Mapping[str, str]) -> bool:
    """Whether a process started with ``env`` runs the caching allocator with expandable
    segments: the first of ALLOC_CONF_VARIABLES set holds ``expandable_segments:True`` among its
    comma-separated ``key:value`` pairs (c10's parser takes exactly ``True`` or ``False``)."""
    for name in ALLOC_CONF_VARIABLES:
        if name in env:
            pairs = (item.split(":", 1) for item in env[name].split(",") if ":" in item)
            return any(key.strip() == "expandable_segments" and value.strip() == "True"
                       for key, value in pairs)
    return False


Fp8Recipe = Literal["delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"]
"""FP8 scaling recipes: Transformer Engine's (Megatron ``--fp8-recipe``) delayed and tensorwise
(current) scaling keep one scale per tensor; torchao's rowwise (torchtitan's float8 converter
``recipe_name``) one per row, priced as tensorwise; blockwise 128x128/1x128 tiles and MXFP8
32-element blocks keep more scales and need their own quantisation pass. Which recipes each
framework names, and how, is in placer.dialects (megatron.FP8_RECIPES, megatron_bridge.
MIXED_PRECISION_RECIPES, torchtitan.FP8_CONVERTERS)."""


class Runtime(Spec):
    """Framework settings of one job that the layout does not say (None: the stack's default)."""

    overlaps: tuple[Overlap, ...] | None = Field(
        default=None, description="communication hidden behind compute; None: the stack's")
    moe_dispatcher: Dispatcher | None = None
    moe_grouped_gemm: bool | None = Field(
        default=None, description="local experts as one grouped GEMM (Megatron --moe-grouped-gemm);"
        " the cost model prices each expert's GEMM problem either way and does not model the "
        "launch overhead of sequential experts")
    moe_capacity_factor: float | None = Field(
        default=None, ge=0.1, le=64.0,
        description="tokens an expert takes, as a multiple of the mean; None: dropless")
    moe_load_imbalance: float | None = Field(
        default=None, ge=1.0, le=64.0,
        description="tokens the busiest expert rank receives, as a multiple of the mean (dropless)")
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = Field(
        default=None, description="main-gradient and reduction dtype (Megatron "
        "--grad-reduce-in-bf16); None: the stack's")
    fp8_recipe: Fp8Recipe | None = Field(
        default=None, description="FP8 scaling recipe, checked against the stack; every recipe "
        "keeps 1-byte GEMM inputs, and its scale tensors (under 4 %) are not priced in memory; "
        "mxfp8's block-scaled GEMMs run 5 % slower than per-tensor-scaled ones (Transformer "
        "Engine's B300 GEMM benchmark)")
    cross_entropy_impl: Literal["native", "te", "flash_attn"] | None = Field(
        default=None, description="fused cross-entropy kernel (Megatron --cross-entropy-loss-fusion"
        " --cross-entropy-fusion-impl): native (Megatron's, fp32), te (Transformer Engine's, in "
        "place on the bf16 logits) or flash_attn (the flash-attn package's CrossEntropyLoss, "
        "llm-foundry's MPT default: a new bf16 gradient); None: native")
    expandable_segments: bool | None = Field(
        default=None, description="the launcher sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
        "True (torchtitan's run_llama_train.sh does): no fragmentation allowance; false: the "
        "caching allocator's fragmentation is allowed for; None: as placer's launch env.sh "
        "sets it (LAUNCH_EXPANDABLE_SEGMENTS)")
    fp8_param_gather: bool = Field(
        default=False, description="keep and all-gather FP8 weights (Megatron --fp8-param-gather, "
        "torchtitan enable_fsdp_float8_all_gather)")
    torch_compile: bool = Field(
        default=False, description="torch.compile what the stack compiles (stack."
        "compile_components; torchtitan's --compile.enable with compile.components [model, loss], "
        "before Aug 2025 --training.compile): each transformer block, whose op-level selective "
        "checkpointing then keeps only the saved outputs its backward reads, and the loss, which "
        "keeps only the bf16 logits; a stack that compiles nothing refuses it")


def runtime_optimizer_bytes(data: Any) -> Any:
    """A job document with its optimizer's gradient and weight bytes set by its runtime.

    ``grad_reduce_dtype: bf16`` means 2-byte main gradients, ``fp8_param_gather`` 1-byte working
    weights (and needs ``precision: fp8``). An optimizer that states other bytes is an error.
    """
    if not isinstance(data, dict):
        return data
    runtime = data.get("runtime")
    if isinstance(runtime, Runtime):
        runtime = runtime.model_dump()
    if not isinstance(runtime, dict):
        return data
    wanted: dict[str, int] = {}
    if runtime.get("grad_reduce_dtype") == "bf16":
        wanted["grad_bytes"] = 2
    elif runtime.get("grad_reduce_dtype") == "fp32":
        wanted["grad_bytes"] = 4
    if runtime.get("fp8_param_gather"):
        if data.get("precision", "bf16") != "fp8":
            raise ValueError("runtime.fp8_param_gather needs precision: fp8")
        wanted["param_bytes"] = 1
    if not wanted:
        return data
    optimizer = data.get("optimizer")
    given = optimizer.model_dump() if hasattr(optimizer, "model_dump") else dict(optimizer or {})
    explicit = optimizer.model_fields_set if hasattr(optimizer, "model_fields_set") else set(given)
    for key, value in wanted.items():
        if key in explicit and given.get(key) != value:
            raise ValueError(f"optimizer.{key}={given.get(key)} contradicts the runtime "
                             f"(which means {value}); drop one of them")
        given[key] = value
    return {**data, "optimizer": given}
