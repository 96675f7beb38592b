"""Read a DeepSpeed config JSON (ZeRO stage, batch sizes, AutoTP) into a ParsedConfig.

DeepSpeed keeps model and pipeline structure in code, so the model comes from ``--model`` and pp
is 1. ``train_batch_size = micro x accumulation x data-parallel size`` (docs/sources.md 7.1) gives
the world size when all three are numbers ("auto" values are left to the cluster).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from placer.check.parsed import ParsedConfig, Settings
from placer.cost.deepspeed_optimizer import (
    Precision,
    gradient_bytes,
    optimizer_wrapper,
)
from placer.cost.options import DEEPSPEED_MAX_LIVE_PARAMS
from placer.dialects import deepspeed
from placer.errors import PlacerError

DEEPSPEED_KEYS = deepspeed.KEYS
# DeepSpeed AutoTP shards each layer over consecutive ranks, with data parallelism outside it.
DEEPSPEED_ORDER = deepspeed.ORDER


def is_deepspeed(data: dict[str, Any]) -> bool:
    return any(key in data for key in DEEPSPEED_KEYS)


def json_key_lines(text: str) -> dict[str, int]:
    """First line of every ``"key":`` in a JSON text (nesting ignored; keys here are unique)."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        for match in re.finditer(r'"([A-Za-z0-9_]+)"\s*:', line):
            lines.setdefault(match.group(1), number)
    return lines


def _number(value: Any, key: str, path: Path) -> int | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlacerError(f"{path}: {key} = {value!r} must be a positive integer or \"auto\"")
    return value


# DeepSpeed's dtype spellings (deepspeed/runtime/config_utils.py DtypeEnum) for
# data_types.grad_accum_dtype.
DTYPE_NAMES: dict[str, Precision] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16"}


def _enabled(data: dict[str, Any], *keys: str) -> bool | None:
    """``{"bf16": {"enabled": true}}``: True / False, None for the HF Trainer's "auto"."""
    for key in keys:
        section = data.get(key)
        if isinstance(section, dict) and "enabled" in section:
            value = section["enabled"]
            return None if value == "auto" else bool(value)
    return False


def read_optimizer_wrapper(parsed: ParsedConfig, s: Settings, stage: int,
                           precision: Precision | None, pipeline: bool,
                           accumulation: str | None = None, cpu_offload: bool = False) -> None:
    """Which optimizer wrapper DeepSpeed 0.19 runs for the config (placer.cost.
    deepspeed_optimizer), set on ``s`` with its gradient bytes and told in a note; DeepSpeed's
    refusal as an error."""
    if precision is None:
        parsed.notes.append("DeepSpeed precision \"auto\": the optimizer wrapper is the "
                            "launcher's; memory priced with fp32 main gradients")
        return
    dtype = DTYPE_NAMES.get(str(accumulation).lower()) if accumulation is not None else None
    if accumulation is not None and dtype is None:
        parsed.problems.append(("framework-refuses", "grad_accum_dtype",
                                f"data_types.grad_accum_dtype = {accumulation!r} is not a "
                                f"dtype DeepSpeed knows ({', '.join(DTYPE_NAMES)})"))
        return
    try:
        wrapper = optimizer_wrapper(stage, precision, pipeline, dtype, cpu_offload)
    except ValueError as exc:
        parsed.problems.append(("framework-refuses", "zero_stage", str(exc)))
        return
    s.deepspeed_optimizer = wrapper
    grad_bytes = gradient_bytes(wrapper, precision, dtype)
    s.grad_reduce_bf16 = grad_bytes == 2
    parsed.notes.append(f"DeepSpeed 0.19 runs {wrapper} (ZeRO stage {stage}, {precision}"
                        f"{', pipeline engine' if pipeline else ''}; engine.py "
                        f"_do_optimizer_sanity_check): {grad_bytes}-byte gradients")


def parse_deepspeed(path: Path, data: dict[str, Any], text: str) -> ParsedConfig:
    where = json_key_lines(text)
    parsed = ParsedConfig(path=str(path), kind="deepspeed", order=DEEPSPEED_ORDER)
    zero = data.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise PlacerError(f"{path}: zero_optimization must be an object")
    stage = _number(zero.get("stage", 0), "zero_optimization.stage", path) or 0
    if stage > 3:
        raise PlacerError(f"{path}: zero_optimization.stage = {stage} must be 0, 1, 2 or 3")
    tp_section = data.get("tensor_parallel") or {}
    tp = None
    if isinstance(tp_section, dict):
        tp = _number(tp_section.get("autotp_size", tp_section.get("tp_size")),
                     "tensor_parallel.autotp_size", path)
    micro = _number(data.get("train_micro_batch_size_per_gpu"),
                    "train_micro_batch_size_per_gpu", path)
    accumulation = _number(data.get("gradient_accumulation_steps"),
                           "gradient_accumulation_steps", path)
    total = _number(data.get("train_batch_size"), "train_batch_size", path)
    parsed.settings = Settings(tp=tp or 1, zero_stage=stage, micro_batch_size=micro or None)
    parsed.global_batch_size = total
    bf16, fp16 = _enabled(data, "bf16", "bfloat16"), _enabled(data, "fp16")
    precision: Precision | None = ("bf16" if bf16 else "fp16" if fp16 else
                                   None if bf16 is None or fp16 is None else "fp32")
    offload = zero.get("offload_optimizer")
    if stage == 3:  # DeepSpeed's per-submodule fetch limit (deepspeed/runtime/zero/config.py)
        live = zero.get("stage3_max_live_parameters", DEEPSPEED_MAX_LIVE_PARAMS)
        parsed.settings.zero3_max_live_params = (
            float(live) if isinstance(live, int | float) and not isinstance(live, bool)
            and live > 0 else DEEPSPEED_MAX_LIVE_PARAMS)
    data_types = data.get("data_types")
    # DeepSpeed keeps the pipeline in the model code (PipelineModule): a JSON alone is pp 1.
    read_optimizer_wrapper(
        parsed, parsed.settings, stage, precision, pipeline=False,
        accumulation=data_types.get("grad_accum_dtype") if isinstance(data_types, dict) else None,
        cpu_offload=isinstance(offload, dict) and offload.get("device") == "cpu")
    for key, name in (("autotp_size", "tp"), ("tp_size", "tp"), ("stage", "zero_stage"),
                      ("train_micro_batch_size_per_gpu", "micro_batch_size"),
                      ("train_batch_size", "global_batch_size")):
        if key in where:
            parsed.lines.setdefault(name, where[key])
    if total and micro and accumulation:
        if total % (micro * accumulation):
            parsed.problems.append((
                "degrees-cluster", "global_batch_size",
                f"train_batch_size={total} is not train_micro_batch_size_per_gpu={micro} x "
                f"gradient_accumulation_steps={accumulation} x a data-parallel size"))
        else:
            parsed.world_size = total // (micro * accumulation) * (tp or 1)
            parsed.notes.append(f"world size {parsed.world_size} from train_batch_size / (micro "
                                "batch x accumulation steps) x tensor-parallel size")
    return parsed
