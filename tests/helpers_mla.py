"""A DeepSeek-V3 plan for the launch tests: the Mixtral 8x22B example's candidates (128 H100s,
EP 8) with the deepseek-v3 preset's model (multi-head latent attention) in place of Mixtral's."""

from __future__ import annotations

from pathlib import Path

from placer.cli.launch_command import load_plan
from placer.spec import Model, Plan
from placer.spec.presets import model_preset

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL_PLAN = ROOT / "examples" / "mixtral-8x22b-16x-dgx-h100" / "plan.json"


def mla_plan(model: Model | None = None) -> Plan:
    """The example's plan with ``model`` (default: deepseek-v3); the candidates' searched
    per-stage layer counts (Mixtral's 56 layers) are dropped, so splits are DeepSeek's 61."""
    plan = load_plan(MIXTRAL_PLAN)
    candidates = [c.model_copy(update={"stage_layers": None}) for c in plan.candidates]
    return plan.model_copy(update={"model": model or model_preset("deepseek-v3"),
                                   "candidates": candidates})
