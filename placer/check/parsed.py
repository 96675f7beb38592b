"""What a parser hands to the rules: the settings of one config, with the line each came from.

Parsers only read; they do not validate degrees (``placer.spec.layout.layout_problem`` does, in
the rules), so a config with impossible degrees still parses and gets a finding, not exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from placer.dims import DEFAULT_ORDER
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.model import Model
from placer.spec.results import RankEntry

ConfigKind = Literal["megatron", "torchtitan", "deepspeed", "plan", "layout"]

# Setting keys are Layout field names; these are the ones a config may leave out (dp is then
# whatever the world size leaves, as Megatron and torchtitan derive it).
LAYOUT_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage",
               "recompute", "sequence_parallel")


@dataclass(frozen=True)
class PlanCandidate:
    """One candidate of a placer plan: its layout, rank order and explicit rank map."""

    index: int
    settings: dict[str, object]
    order: tuple[str, ...]
    rank_map: tuple[RankEntry, ...]


@dataclass
class ParsedConfig:
    """Settings read from one config file, before any cluster or model is applied."""

    path: str
    kind: ConfigKind
    settings: dict[str, object] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    order: tuple[str, ...] = DEFAULT_ORDER
    world_size: int | None = None
    nproc_per_node: int | None = None
    model: Model | None = None
    model_ref: str | None = None
    seq_len: int | None = None
    global_batch_size: int | None = None
    cluster: Cluster | None = None
    job: Job | None = None
    candidates: list[PlanCandidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (rule id, setting key, message) for problems a parser sees that no later rule can
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    recognised: bool = True

    def line_of(self, *keys: str) -> int | None:
        """Line of the first of ``keys`` the config set explicitly."""
        for key in keys:
            if key in self.lines:
                return self.lines[key]
        return None
