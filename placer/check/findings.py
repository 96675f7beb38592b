"""What ``placer check`` reports: findings, unreadable inputs, and the whole report.

These are output models, so ``placer check --format json`` is documented by their JSON schema.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from placer.spec.base import Output

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2}
REPORT_FORMAT = "placer-check/1"


class Finding(Output):
    """One rule that fired on one config (one finding per rule and config, naming the first
    offending group and how many others share the problem)."""

    rule_id: str = Field(description="stable id, e.g. tp-cross-node")
    severity: Severity
    message: str = Field(description="one line naming the group, its ranks and the nodes")
    file: str
    line: int | None = Field(default=None, description="1-based line of the offending setting")
    group: str | None = Field(default=None, description="parallel dimension: tp, ep, cp, pp...")
    ranks: list[int] = Field(default_factory=list, description="global ranks of the first group")
    nodes: list[int] = Field(default_factory=list, description="nodes those ranks run on")
    candidate: int | None = Field(default=None, description="plan candidate index, for plans")
    config: str | None = Field(default=None, description="config inside the file, if several")


class InputProblem(Output):
    """A config that could not be read or understood (exit code 2)."""

    file: str
    message: str


class ConfigSummary(Output):
    """What was understood of one config: its kind, the layout checked and on what."""

    file: str
    kind: Literal["megatron", "megatron-deepspeed", "torchtitan", "deepspeed", "gpt-neox", "nemo",
                  "plan", "layout", "other"]
    config: str | None = Field(default=None, description="config inside the file, if several")
    layout: str | None = Field(default=None, description="compact layout, when it resolved")
    order: str | None = Field(default=None, description="rank order, innermost first")
    cluster: str | None = None
    num_gpus: int | None = None
    model: str | None = None
    notes: list[str] = Field(default_factory=list, description="assumptions made while checking")


class CheckReport(Output):
    """Everything one ``placer check`` run found (``--format json``)."""

    format: Literal["placer-check/1"] = REPORT_FORMAT
    fail_on: Literal["error", "warning"]
    exit_code: int = Field(description="0 clean, 1 findings at or above fail_on, 2 unreadable")
    configs: list[ConfigSummary]
    findings: list[Finding]
    problems: list[InputProblem] = Field(default_factory=list)
    counts: dict[str, int] = Field(description="findings per severity")
