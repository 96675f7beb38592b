"""The human report: every candidate, its breakdown and memory, the defaults and the why."""

from __future__ import annotations

import re

from test_report_plan import make_candidate

from placer.cost.validity import MODEL_ERROR
from placer.report.baseline import Baseline
from placer.report.defaults import resolve_job
from placer.report.plan import Recommendation, build_plan
from placer.report.tables import WIDTH, cluster_text, render_text
from placer.spec import Layout
from placer.spec.cluster import Cluster
from placer.spec.presets import cluster_preset, model_preset

MODEL = model_preset("llama3-70b")
CLUSTER = cluster_preset("dgx-h100").with_nodes(8)


def recommendation() -> Recommendation:
    job, used = resolve_job(MODEL, seq_len=None, global_batch=None)
    first = make_candidate(Layout(tp=8, pp=4, dp=2, zero_stage=1, recompute="selective",
                                  sequence_parallel=True), parts={"pp_bubble_s": 1.25},
                           why=["placement: mesh order tp-cp-dp-pp"])
    second = make_candidate(Layout(tp=4, pp=8, dp=2, vpp=5, recompute="full"),
                            parts={"recompute_s": 3.5, "pp_bubble_s": 0.5}, memory_gib=41.0,
                            why=["interleaving shrinks the bubble"])
    default = make_candidate(Layout(tp=8, pp=8, dp=1, recompute="selective",
                                    sequence_parallel=True), parts={"pp_bubble_s": 3.0})
    plan = build_plan(MODEL, CLUSTER, job, [first, second], defaults_used=used,
                      explanation=["Best: first sentence.", "Links: second sentence."])
    return Recommendation(plan, Baseline(default.layout, default))


def test_report_lists_candidates_the_default_row_and_the_why() -> None:
    text = render_text(recommendation())
    lines = text.splitlines()
    assert lines[0].split() == ["model", "llama3-70b"]
    assert "8 x dgx-h100 (64 usable GPUs: H100-SXM-80GB)" in lines[1]
    assert any(line.startswith("defaults used seq_len=8192") for line in lines)
    rows = [re.split(r"\s{2,}", line) for line in lines
            if line[:1] in ("1", "2") or line.startswith("rule")]
    table_rows = [row for row in rows if len(row) == 18]
    assert [row[:4] for row in table_rows] == [["1", "8", "4", "2"], ["2", "4", "8", "2"],
                                               ["rule", "8", "8", "1"]]
    assert table_rows[1][9] == "full" and table_rows[1][6] == "5"
    # vs base: the rule's 13.0 s step over each candidate's, a tie within the measured error
    first, second = 13.0 / 11.25 - 1, 13.0 / 14.0 - 1
    assert [row[-1] for row in table_rows] == [
        f"{first:+.1%}" + (" tie" if first < MODEL_ERROR else ""),
        f"{second:+.1%}" + (" tie" if -second < MODEL_ERROR else ""), "+0.0% tie"]
    assert "- Best: first sentence." in lines and "- Links: second sentence." in lines
    notes = lines.index("Search notes on #1 (--json has every candidate's):")
    assert lines[notes + 1] == "- placement: mesh order tp-cp-dp-pp"
    assert "interleaving shrinks the bubble" not in text


def test_breakdown_table_shows_only_parts_some_row_uses() -> None:
    text = render_text(recommendation())
    header = next(line for line in text.splitlines() if line.startswith("#  ")
                  and "compute" in line.split())
    assert header.split() == ["#", "compute", "recomp", "PP", "bubble", "step"]
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.split() and line.split()[0] in ("1", "2", "rule") and len(line.split()) == 5}
    assert rows["2"] == ["10.000", "3.500", "0.500", "14.000"]


def test_memory_table_reports_usable_memory_and_the_worst_stage() -> None:
    text = render_text(recommendation())
    lines = text.splitlines()
    start = lines.index("Memory per GPU (GiB, most loaded pipeline stage)")
    assert lines[start + 1].split()[-3:] == ["total", "usable", "stage"]
    assert lines[start + 4].split()[-3:] == ["41.0", "75.0", "0"]


def test_report_is_stable_plain_text_within_the_width() -> None:
    text = render_text(recommendation())
    assert text == render_text(recommendation())
    assert "\x1b" not in text
    assert all(len(line) <= WIDTH and line == line.rstrip() for line in text.splitlines())


def test_cluster_text_names_pools_and_excluded_gpus() -> None:
    data = cluster_preset("dgx-h100").model_dump()
    data["pools"] = [{"node_type": "dgx-h100", "count": 4}]
    data["excluded_gpus"] = [{"node": 1, "gpu": 3}, {"node": 2, "gpu": 0}]
    text = cluster_text(Cluster.model_validate(data))
    assert text == "4 x dgx-h100 (30 usable GPUs, 2 excluded: H100-SXM-80GB)"
