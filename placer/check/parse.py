"""Which parser reads a file: by extension, then by content for JSON and YAML."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from placer.check.parse_deepspeed import is_deepspeed, parse_deepspeed
from placer.check.parse_megatron import parse_megatron
from placer.check.parse_plan import is_layout_file, is_plan, parse_layout_file, parse_plan
from placer.check.parse_torchtitan import parse_torchtitan
from placer.check.parse_yaml_frameworks import is_nemo, is_neox, parse_nemo, parse_neox
from placer.check.parsed import ParsedConfig
from placer.errors import PlacerError
from placer.spec.presets import MAX_INPUT_BYTES, read_document

DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")


def _text(path: Path) -> str:
    if not path.is_file():
        raise PlacerError(f"{path}: no such file")
    if path.stat().st_size > MAX_INPUT_BYTES:
        raise PlacerError(f"{path}: file is larger than {MAX_INPUT_BYTES // 2**20} MiB")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlacerError(f"{path}: cannot read as UTF-8 text ({exc.__class__.__name__})") from None


def read_config(path: Path, inputs: Mapping[str, str] | None = None) -> ParsedConfig:
    """Parse one config; every problem reading it is a one-line PlacerError naming the file.

    ``inputs``: environment variables known before a launch script runs (``--env``, and the
    node count of ``--nodes``)."""
    try:
        return _read(path, inputs or {})
    except PlacerError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise PlacerError(f"{path}: {exc}") from None


def _read(path: Path, inputs: Mapping[str, str]) -> ParsedConfig:
    text = _text(path)
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return parse_torchtitan(path, text)
    if suffix not in DOCUMENT_SUFFIXES:
        return parse_megatron(path, text, inputs)
    data = read_document(path)
    if is_plan(data):
        return parse_plan(path, data)
    if is_layout_file(data):
        return parse_layout_file(path, data, text)
    if is_neox(data):
        return parse_neox(path, data, text)
    if is_nemo(data):
        return parse_nemo(path, data, text)
    if suffix == ".json" and isinstance(data, dict) and is_deepspeed(data):
        return parse_deepspeed(path, data, text)
    if isinstance(data, dict) and "format" in data:
        raise PlacerError(f"{path}: format {json.dumps(data['format'])} is not "
                          "placer-plan/1")
    raise PlacerError(f"{path}: not a placer plan (format: placer-plan/1), a layout file (a "
                      "layout key) or a DeepSpeed config (train_batch_size / zero_optimization)")
