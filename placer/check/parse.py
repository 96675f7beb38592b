"""Which parser reads a file: by extension, then by content for JSON and YAML."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from placer.check.parse_deepspeed import is_deepspeed, parse_deepspeed
from placer.check.parse_megatron import parse_megatron
from placer.check.parse_plan import is_layout_file, is_plan, parse_layout_file, parse_plan
from placer.check.parse_torchtitan import parse_torchtitan
from placer.check.parse_torchtitan_py import is_torchtitan_py, parse_torchtitan_py
from placer.check.parse_yaml_frameworks import is_nemo, is_neox, parse_nemo, parse_neox
from placer.check.parsed import WORLD_KEYS, ParsedConfig
from placer.check.world import placer_world
from placer.errors import PlacerError
from placer.spec.presets import MAX_INPUT_BYTES, read_document

DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")
TEXT_SUFFIXES = (".md", ".rst")


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
    """The first (usually only) config of a file; see ``read_configs``."""
    return read_configs(path, inputs)[0]


def read_configs(path: Path, inputs: Mapping[str, str] | None = None) -> list[ParsedConfig]:
    """Every config of one file (a torchtitan registry holds several); every problem reading
    it is a one-line PlacerError naming the file.

    ``inputs``: environment variables known before a launch script runs (``--env``, and the
    node count of ``--nodes``)."""
    try:
        text = _text(path)
        configs = _dispatch(path, text, inputs or {})
    except PlacerError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise PlacerError(f"{path}: {exc}") from None
    header = placer_world(text)
    for parsed in configs:
        if header is not None and parsed.world_size is None:
            nodes, per_node, line = header
            parsed.world_size, parsed.nproc_per_node = nodes * per_node, per_node
            parsed.world_source = f"its placer-world line: {nodes} nodes x {per_node} GPUs"
            parsed.lines.setdefault("world", line)
            for key in WORLD_KEYS:
                parsed.unresolved.pop(key, None)
    return configs


def _other(path: Path, what: str) -> list[ParsedConfig]:
    """A file that is no training config (a README, a rank map, a Kubernetes object)."""
    return [ParsedConfig(path=str(path), kind="other", recognised=False, notes=[what])]


def _dispatch(path: Path, text: str, inputs: Mapping[str, str]) -> list[ParsedConfig]:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return _other(path, "documentation, not a config")
    if suffix == ".py":
        if is_torchtitan_py(text):
            configs = parse_torchtitan_py(path, text)
            if configs:
                return configs
        return _other(path, "Python without a torchtitan ParallelismConfig")
    if suffix in DOCUMENT_SUFFIXES:
        data = read_document(path)
        if isinstance(data, dict) and str(data.get("format", "")).startswith("placer-") \
                and not is_plan(data):
            return _other(path, f"placer's {data['format']} file: no parallel settings")
        if isinstance(data, dict) and "apiVersion" in data and "kind" in data:
            return _other(path, f"a Kubernetes {data['kind']}: no parallel settings")
    return [_read(path, text, inputs)]


def _read(path: Path, text: str, inputs: Mapping[str, str]) -> ParsedConfig:
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
                      "layout key), a DeepSpeed config (train_batch_size / zero_optimization), a "
                      "GPT-NeoX config (pipe_parallel_size / model_parallel_size) or a NeMo "
                      "config (model.tensor_model_parallel_size)")
