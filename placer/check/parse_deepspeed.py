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
