"""Shared helpers of the ``placer check`` tests: run the checker or the CLI on test data."""

from __future__ import annotations

from pathlib import Path

from placer.check import CheckOptions, CheckReport, Finding, check_paths
from placer.spec.presets import load_cluster, load_model

DATA = Path(__file__).resolve().parent / "data" / "check"
ROOT = DATA.parents[2]


def run_check(*names: str | Path, cluster: str | None = "dgx-h100", model: str | None = None,
              nodes: int | None = None, seq_len: int | None = None,
              candidate: int | None = None, fail_on: str = "error") -> CheckReport:
    """check_paths on files of tests/data/check (or any path), with presets by name."""
    paths = [n if isinstance(n, Path) else DATA / n for n in names]
    cluster_ref = str(DATA / cluster) if cluster and cluster.endswith(".yaml") else cluster
    options = CheckOptions(cluster=load_cluster(cluster_ref) if cluster_ref else None,
                           model=load_model(model) if model else None, nodes=nodes,
                           seq_len=seq_len, candidate=candidate)
    return check_paths(paths, options, fail_on)


def rule_ids(report: CheckReport) -> list[str]:
    return [f.rule_id for f in report.findings]


def only(report: CheckReport, rule_id: str) -> Finding:
    matches = [f for f in report.findings if f.rule_id == rule_id]
    assert len(matches) == 1, report.findings
    return matches[0]


def line_of(path: Path, text: str) -> int:
    """1-based line of the last line containing ``text`` (argparse: the last flag wins)."""
    lines = [i for i, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    assert lines, text
    return lines[-1]


