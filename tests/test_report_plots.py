"""Pictures: written, readable (not trivial), stable, and a clear error without matplotlib."""

from __future__ import annotations

import builtins
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from test_report_plan import make_candidate

from placer.errors import PlacerError
from placer.report import plots
from placer.report.defaults import resolve_job
from placer.report.plan import build_plan
from placer.spec import Layout
from placer.spec.cluster import Cluster
from placer.spec.presets import cluster_preset, model_preset

MODEL = model_preset("llama3-70b")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def plan_for(cluster: Cluster, layouts: list[Layout], **kwargs: Any) -> Any:
    job, used = resolve_job(MODEL, seq_len=None, global_batch=None)
    cands = [make_candidate(lay, parts={"pp_bubble_s": 0.5 * i, "tp_exposed_s": 0.4},
                            **kwargs) for i, lay in enumerate(layouts, 1)]
    return build_plan(MODEL, cluster, job, cands, defaults_used=used)


def test_plot_plan_writes_png_and_svg_of_the_rank_map_and_breakdown(tmp_path: Path) -> None:
    plan = plan_for(cluster_preset("dgx-h100").with_nodes(8),
                    [Layout(tp=8, pp=4, dp=2), Layout(tp=4, pp=8, dp=2), Layout(tp=8, pp=8)])
    paths = plots.plot_plan(plan, tmp_path)
    assert sorted(p.name for p in paths) == ["breakdown.png", "breakdown.svg", "rankmap.png",
                                             "rankmap.svg"]
    width, height = png_size(tmp_path / "rankmap.png")
    assert width > 800 and height > 500
    assert (tmp_path / "rankmap.png").stat().st_size > 30_000
    assert (tmp_path / "breakdown.png").stat().st_size > 20_000
    svg = (tmp_path / "rankmap.svg").read_text()
    assert "TP group 7" in svg and "r63" in svg and "PP3 DP1" in svg and "node 7" in svg
    chart = (tmp_path / "breakdown.svg").read_text()
    assert "pipeline bubble" in chart and "#3" in chart
    assert "predicted time per step (s)" in chart


def test_plots_are_byte_identical_across_runs(tmp_path: Path) -> None:
    plan = plan_for(cluster_preset("dgx-h100").with_nodes(2), [Layout(tp=8, pp=2)])
    first = {p.name: p.read_bytes() for p in plots.plot_plan(plan, tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in plots.plot_plan(plan, tmp_path / "b")}
    assert first == second


def test_large_clusters_draw_the_first_nodes_and_say_so(tmp_path: Path) -> None:
    plan = plan_for(cluster_preset("dgx-h100").with_nodes(64), [Layout(tp=8, pp=8, dp=8)])
    plots.plot_rank_map(plan.candidates[0], plan.cluster, tmp_path / "map", "big")
    svg = (tmp_path / "map.svg").read_text()
    assert "first 8 of 64 nodes" in svg
    assert "node 7" in svg and "node 8" not in svg


def test_failed_gpus_are_marked(tmp_path: Path) -> None:
    data = cluster_preset("dgx-h100").model_dump()
    data["pools"] = [{"node_type": "dgx-h100", "count": 3}]
    data["excluded_gpus"] = [{"node": 1, "gpu": 5}]
    cluster = Cluster.model_validate(data)
    cand = make_candidate(Layout(tp=4, pp=1, dp=4), skip_slots=frozenset({(1, 5)}))
    plots.plot_rank_map(cand, cluster, tmp_path / "map", "a map")
    svg = (tmp_path / "map.svg").read_text()
    assert svg.count(">failed<") == 1 and svg.count(">unused<") == 7


def test_missing_matplotlib_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "matplotlib":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    for name in [m for m in sys.modules if m.split(".")[0] == "matplotlib"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PlacerError) as err:
        plots.require_matplotlib()
    assert str(err.value).endswith("install it with: pip install matplotlib")
