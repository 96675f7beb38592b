"""Run ``placer check`` over several files and decide the exit code.

Exit codes: 0 clean, 1 a finding at or above ``fail_on``, 2 an unreadable input (a missing file,
a parse error, or a file that is none of the supported kinds). A file that parses but holds no
parallel settings is not an input error: it gets an info finding (``no-parallel-settings``), so
a CI glob that also matches unrelated scripts does not fail the build.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from placer.check.findings import (
    SEVERITY_RANK,
    CheckReport,
    ConfigSummary,
    Finding,
    InputProblem,
)
from placer.check.parse import read_configs
from placer.check.resolve import CheckOptions, check_config
from placer.check.rules import RULES
from placer.errors import PlacerError

CLEAN, FINDINGS, UNREADABLE = 0, 1, 2
_RULE_ORDER = {rule_id: i for i, rule_id in enumerate(RULES)}


def check_paths(paths: Sequence[str | Path], options: CheckOptions,
                fail_on: str = "error") -> CheckReport:
    """Check every file; one unreadable file does not stop the others being checked."""
    if fail_on not in ("error", "warning"):
        raise PlacerError(f"--fail-on: {fail_on!r} is not valid; use error or warning")
    configs: list[ConfigSummary] = []
    findings: list[Finding] = []
    problems: list[InputProblem] = []
    for raw in paths:
        path = Path(raw)
        try:
            checked = [check_config(parsed, options)
                       for parsed in read_configs(path, options.inputs())]
        except PlacerError as exc:
            message = str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}"
            problems.append(InputProblem(file=str(path), message=message))
            continue
        for summary, found in checked:
            configs.append(summary)
            found = [f.model_copy(update={"config": summary.config}) for f in found]
            findings += sorted(found, key=lambda f: (
                -1 if f.candidate is None else f.candidate, -SEVERITY_RANK[f.severity],
                _RULE_ORDER[f.rule_id]))
    counts = {severity: sum(f.severity == severity for f in findings)
              for severity in ("error", "warning", "info")}
    threshold = SEVERITY_RANK[fail_on]
    if problems:
        code = UNREADABLE
    elif any(SEVERITY_RANK[f.severity] >= threshold for f in findings):
        code = FINDINGS
    else:
        code = CLEAN
    return CheckReport(fail_on=fail_on, exit_code=code, configs=configs,  # type: ignore[arg-type]
                       findings=findings, problems=problems, counts=counts)
