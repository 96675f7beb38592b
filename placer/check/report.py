"""Render a CheckReport: text for people, JSON for CI systems, GitHub Actions annotations."""

from __future__ import annotations

import json

from placer.check.findings import CheckReport, Finding

FORMATS = ("text", "json", "github")
_GITHUB_COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def render(report: CheckReport, fmt: str) -> str:
    if fmt == "json":
        return render_json(report)
    if fmt == "github":
        return render_github(report)
    return render_text(report)


def render_json(report: CheckReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True)


def _where(item: Finding) -> str:
    parts = [f"line {item.line}"] if item.line is not None else []
    if item.candidate is not None:
        parts.append(f"candidate {item.candidate}")
    return f" ({', '.join(parts)})" if parts else ""


def summary_line(report: CheckReport) -> str:
    counts = report.counts
    files = len(report.configs) + len(report.problems)
    text = (f"placer check: {counts.get('error', 0)} error(s), {counts.get('warning', 0)} "
            f"warning(s), {counts.get('info', 0)} info in {files} file(s)")
    if report.problems:
        text += f"; {len(report.problems)} unreadable"
    return f"{text}; exit {report.exit_code} (fail on {report.fail_on})"


def render_text(report: CheckReport) -> str:
    """Per config: a header, its findings, its notes; unreadable files are for stderr."""
    lines: list[str] = []
    for config in report.configs:
        head = f"{config.file}{f' ({config.config})' if config.config else ''}: {config.kind}"
        if config.layout:
            head += f" {config.layout} order {config.order}"
        if config.cluster:
            gpus = (f"{config.num_gpus} GPUs" if config.num_gpus is not None
                    else "world size unknown")
            head += f" on {config.cluster} ({gpus})"
        if config.model:
            head += f", model {config.model}"
        lines.append(head)
        for item in (f for f in report.findings
                     if f.file == config.file and f.config == config.config):
            lines.append(f"  {item.severity:<7} {item.rule_id}{_where(item)}: {item.message}")
        for note in config.notes:
            lines.append(f"  note: {note}")
    lines.append(summary_line(report))
    return "\n".join(lines)


def _escape_data(text: str) -> str:
    """GitHub workflow-command escaping of a message (actions/toolkit, command.ts)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def render_github(report: CheckReport) -> str:
    """``::error file=F,line=L,title=RULE::message`` per finding; info becomes ``::notice``."""
    lines: list[str] = []
    for problem in report.problems:
        lines.append(f"::error file={_escape_property(problem.file)},"
                     f"title=placer check::{_escape_data(problem.message)}")
    for item in report.findings:
        props = [f"file={_escape_property(item.file)}"]
        if item.line is not None:
            props.append(f"line={item.line}")
        title = item.rule_id if item.candidate is None else f"{item.rule_id} (candidate " \
            f"{item.candidate})"
        if item.config:
            title += f" [{item.config}]"
        props.append(f"title={_escape_property(title)}")
        lines.append(f"::{_GITHUB_COMMAND[item.severity]} {','.join(props)}::"
                     f"{_escape_data(item.message)}")
    lines.append(summary_line(report))
    return "\n".join(lines)
