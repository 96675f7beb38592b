"""Read placer's own files: a plan (``placer-plan/1``) or a layout file.

A plan carries its cluster, model, job and, per candidate, an explicit rank map, so it is
checked as written. A layout file is a small hand-written YAML/JSON (see ``LayoutFile``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from placer.check.parsed import LAYOUT_KEYS, ParsedConfig, PlanCandidate, Settings
from placer.dims import DEFAULT_ORDER
from placer.mesh import order_text, parse_order
from placer.spec.base import Spec
from placer.spec.cluster import Cluster
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.presets import cluster_names, load_cluster, load_model, model_names, validated
from placer.spec.results import Plan

PLAN_FORMAT = "placer-plan/1"


class LayoutFile(Spec):
    """A hand-written layout to check: ``layout: tp=8,pp=2`` plus what it runs on."""

    layout: str | dict[str, Any] = Field(
        description="compact form (tp=8,pp=2,mbs=1) or a mapping of Layout fields; a missing "
        "dp is what the world size leaves")
    order: str = Field(default=order_text(DEFAULT_ORDER),
                       description="rank order, innermost first (Megatron spelling)")
    model: str | dict[str, Any] | None = Field(
        default=None, description="preset name, model file (relative to this file) or fields")
    cluster: str | dict[str, Any] | None = Field(
        default=None, description="preset name, cluster file (relative to this file) or fields")
    num_gpus: int | None = Field(default=None, ge=1, description="world size, if not tp*pp*dp*cp")
    global_batch_size: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)

    @field_validator("order")
    @classmethod
    def _order(cls, value: str) -> str:
        parse_order(value)
        return value


def is_plan(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == PLAN_FORMAT


def is_layout_file(data: Any) -> bool:
    return isinstance(data, dict) and "layout" in data and "format" not in data


def parse_plan(path: Path, data: dict[str, Any]) -> ParsedConfig:
    plan = validated(Plan, data, str(path))
    parsed = ParsedConfig(path=str(path), kind="plan", cluster=plan.cluster, model=plan.model,
                          job=plan.job, world_size=plan.num_gpus,
                          seq_len=plan.job.seq_len, global_batch_size=plan.job.global_batch_size)
    if not plan.candidates:
        parsed.recognised = False
    for index, candidate in enumerate(plan.candidates):
        parsed.candidates.append(PlanCandidate(
            index=index, settings=candidate.layout.model_dump(),
            order=parse_order(candidate.mesh_order), rank_map=tuple(candidate.rank_map)))
    return parsed


def _explicit_layout(value: str | dict[str, Any], source: str) -> Settings:
    """Only the layout fields the file set (so a missing dp stays derivable)."""
    layout = Layout.parse(value) if isinstance(value, str) else validated(Layout, value, source)
    settings = Settings()
    for name in sorted(layout.model_fields_set):
        if hasattr(settings, name):
            setattr(settings, name, getattr(layout, name))
    return settings


def _relative(ref: str, base: Path, presets: list[str]) -> str:
    return ref if ref in presets or Path(ref).is_absolute() else str(base / ref)


def _top_level_lines(text: str) -> dict[str, int]:
    """1-based line of each top-level key (``key:`` in YAML, ``"key":`` in JSON)."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.match(r'^\s{0,2}"?([A-Za-z_]+)"?\s*:', line)
        if match:
            lines.setdefault(match.group(1), number)
    return lines


def parse_layout_file(path: Path, data: dict[str, Any], text: str) -> ParsedConfig:
    spec = validated(LayoutFile, data, str(path))
    parsed = ParsedConfig(path=str(path), kind="layout", order=parse_order(spec.order),
                          seq_len=spec.seq_len, global_batch_size=spec.global_batch_size)
    parsed.settings = _explicit_layout(spec.layout, f"{path}.layout")
    where = _top_level_lines(text)
    if "layout" in where:
        parsed.lines = {key: where["layout"] for key in (*LAYOUT_KEYS, "layers_per_virtual_stage")}
    for key in ("order", "seq_len", "global_batch_size", "num_gpus"):
        if key in where:
            parsed.lines[{"num_gpus": "world"}.get(key, key)] = where[key]
    if isinstance(spec.model, str):
        parsed.model = load_model(_relative(spec.model, path.parent, model_names()))
    elif spec.model is not None:
        parsed.model = validated(Model, {"name": path.stem, **spec.model}, f"{path}.model")
    if isinstance(spec.cluster, str):
        parsed.cluster = load_cluster(_relative(spec.cluster, path.parent, cluster_names()))
    elif spec.cluster is not None:
        parsed.cluster = validated(Cluster, {"name": path.stem, **spec.cluster},
                                   f"{path}.cluster")
    if spec.num_gpus is not None:
        parsed.world_size = spec.num_gpus
    elif parsed.settings.dp is not None:
        s = parsed.settings
        parsed.world_size = s.tp * s.pp * s.dp * s.cp
    return parsed

