"""``placer check``: read existing parallel configs and flag layouts that waste the hardware.

Inputs: Megatron-LM launch scripts, torchtitan TOML, DeepSpeed JSON, placer plans and layout
files (``parse``). Each is placed on the cluster as torchrun would launch it (or by a plan's
rank map) and checked by the rules in ``rules.RULES``; ``report`` renders the findings.
"""

from placer.check.checker import CLEAN, FINDINGS, UNREADABLE, check_paths
from placer.check.findings import CheckReport, ConfigSummary, Finding, InputProblem
from placer.check.parse import read_config
from placer.check.parse_plan import LayoutFile
from placer.check.report import FORMATS, render
from placer.check.resolve import CheckOptions, check_config
from placer.check.rules import RULES, Rule

__all__ = [
    "CLEAN", "FINDINGS", "FORMATS", "RULES", "UNREADABLE", "CheckOptions", "CheckReport",
    "ConfigSummary", "Finding", "InputProblem", "LayoutFile", "Rule", "check_config",
    "check_paths", "read_config", "render",
]
