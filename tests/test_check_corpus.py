"""``placer check`` over real public launch configs and files derived from them.

tests/data/check_corpus/corpus.json lists each file with its repository, commit and path (or
the file it was derived from), the cluster and node count its documentation gives, and the
verdict an expert reaches from the file and its docs: ``pass`` (no error) or ``fail`` with the
rule that must name the problem. ``rules`` of a passing file are warnings that must appear
(an unknown model or world size is never a silent pass).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.check import CheckOptions, CheckReport, check_paths
from placer.spec.presets import load_cluster

CORPUS = Path(__file__).resolve().parent / "data" / "check_corpus"
ENTRIES = json.loads((CORPUS / "corpus.json").read_text())


def run_entry(entry: dict[str, object]) -> CheckReport:
    cluster = str(entry["cluster"])
    if cluster.endswith(".yaml"):  # a cluster file of the corpus, for a file's own hardware
        cluster = str(CORPUS / cluster)
    options = CheckOptions(cluster=load_cluster(cluster),
                           nodes=entry.get("nodes"))  # type: ignore[arg-type]
    return check_paths([CORPUS / str(entry["file"])], options)


def outcome(entry: dict[str, object], report: CheckReport) -> str:
    """right, false error, missed or unreadable, as the corpus table counts them."""
    if report.problems:
        return "unreadable"
    errors = {f.rule_id for f in report.findings if f.severity == "error"}
    named = {f.rule_id for f in report.findings}
    if entry["verdict"] == "pass":
        if errors:
            return "false error"
        return "right" if set(entry["rules"]) <= named else "missed"  # type: ignore[arg-type]
    return "right" if set(entry["rules"]) <= errors else "missed"  # type: ignore[arg-type]


def test_corpus_has_40_real_files_with_their_source() -> None:
    real = {e["file"] for e in ENTRIES if "repo" in e}
    assert len(real) >= 40
    for entry in ENTRIES:
        assert (CORPUS / entry["file"]).is_file(), entry["file"]
        source = entry if "repo" in entry else entry.get("derived_from", {})
        assert not source or len(source["commit"]) == 40
    assert any(e["verdict"] == "fail" and "tp-cross-node" in e["rules"] for e in ENTRIES)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_corpus_verdict(entry: dict[str, object]) -> None:
    report = run_entry(entry)
    assert outcome(entry, report) == "right", (entry["why"], report.findings, report.problems)
    assert report.exit_code == (0 if entry["verdict"] == "pass" else 1)
