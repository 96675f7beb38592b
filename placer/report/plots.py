"""Pictures of a plan (matplotlib, a dependency imported only when a picture is drawn).

- the rank map of a candidate: nodes x GPUs, each cell coloured by its TP group and marked with
  its rank, PP stage and DP index (large clusters: the first nodes only, and the title says so);
- the step-time breakdown of the top K as stacked bars.

Files are written without dates or random ids, so the same plan gives the same files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from placer.dims import Dim
from placer.errors import PlacerError
from placer.report.describe import BREAKDOWN_LABELS
from placer.report.plan import Recommendation
from placer.spec.cluster import Cluster
from placer.spec.results import Candidate, Estimate, Plan

MAX_NODES_DRAWN = 16
"""Rank maps of larger clusters draw only their first ``NODES_DRAWN_WHEN_LARGE`` nodes."""
NODES_DRAWN_WHEN_LARGE = 8
FORMATS = ("png", "svg")
LEGEND_GROUPS = 8
PART_COLOURS = {
    "compute_s": "#4c78a8", "recompute_s": "#9ecae9", "tp_exposed_s": "#f58518",
    "cp_exposed_s": "#ffbf79", "ep_exposed_s": "#e45756", "pp_bubble_s": "#72b7b2",
    "pp_p2p_s": "#b279a2", "dp_exposed_s": "#54a24b", "zero_exposed_s": "#eeca3b",
    "optimizer_s": "#9d755d",
}


def require_matplotlib() -> Any:
    """The matplotlib module, or a one-line error saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise PlacerError("--plot needs matplotlib (a dependency of placer that is missing "
                          "here); install it with: pip install matplotlib") from None
    return matplotlib


def _pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend."""
    matplotlib = require_matplotlib()
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams["svg.hashsalt"] = "placer"
    plt.rcParams["svg.fonttype"] = "none"
    return plt


def _save(fig: Any, stem: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        metadata = {"Date": None} if fmt == "svg" else {"Software": None}
        fig.savefig(path, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
        paths.append(path)
    return paths


def _tp_group_ids(candidate: Candidate) -> dict[int, int]:
    """Rank -> TP group number, groups numbered by their lowest rank."""
    keys: dict[tuple[int, ...], int] = {}
    out = {}
    for entry in sorted(candidate.rank_map, key=lambda e: e.rank):
        key = tuple(v for k, v in sorted(entry.coords.items()) if k in (Dim.PP, Dim.DP, Dim.CP))
        out[entry.rank] = keys.setdefault(key, len(keys))
    return out


def plot_rank_map(candidate: Candidate, cluster: Cluster, stem: Path, title: str,
                  formats: Sequence[str] = FORMATS) -> list[Path]:
    """Draw where each rank runs; returns the PNG and SVG paths."""
    plt = _pyplot()
    from matplotlib.patches import Patch, Rectangle

    nodes = cluster.nodes()
    shown = nodes if len(nodes) <= MAX_NODES_DRAWN else nodes[:NODES_DRAWN_WHEN_LARGE]
    columns = max(n.node_type.gpus_per_node for n in shown)
    by_slot = {(e.node, e.gpu): e for e in candidate.rank_map}
    groups = _tp_group_ids(candidate)
    cmap = plt.get_cmap("tab20")
    layout = candidate.layout
    cell_w, cell_h = 1.25, 0.85
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * columns + 2.5), 1.0 + 0.62 * len(shown)))
    for row, node in enumerate(shown):
        for gpu in range(columns):
            x, y = gpu * cell_w, -row * cell_h
            entry = by_slot.get((node.index, gpu))
            if gpu >= node.node_type.gpus_per_node:
                continue
            if entry is None:
                reason = "failed" if gpu not in node.healthy_gpus else "unused"
                ax.add_patch(Rectangle((x, y), cell_w * 0.95, cell_h * 0.9, facecolor="#eeeeee",
                                       edgecolor="#bbbbbb", hatch="//"))
                ax.text(x + cell_w * 0.475, y + cell_h * 0.45, reason, ha="center", va="center",
                        fontsize=7, color="#b00000" if reason == "failed" else "#555555",
                        bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5})
                continue
            colour = cmap(groups[entry.rank] % cmap.N)
            ax.add_patch(Rectangle((x, y), cell_w * 0.95, cell_h * 0.9, facecolor=colour,
                                   edgecolor="black", linewidth=0.6))
            coords = entry.coords
            marks = [f"r{entry.rank}", f"PP{coords.get('pp', 0)} DP{coords.get('dp', 0)}"]
            extra = []
            if layout.cp > 1:
                extra.append(f"CP{coords.get('cp', 0)}")
            if layout.ep > 1:
                extra.append(f"EP{coords.get('ep', 0)}")
            if extra:
                marks.append(" ".join(extra))
            ax.text(x + cell_w * 0.475, y + cell_h * 0.45, "\n".join(marks), ha="center",
                    va="center", fontsize=6.5 if len(marks) < 3 else 5.5,
                    color="white" if _dark(colour) else "black")
    ax.set_xlim(-0.1, columns * cell_w)
    ax.set_ylim(-(len(shown) - 1) * cell_h - 0.1, cell_h)
    ax.set_xticks([g * cell_w + cell_w * 0.475 for g in range(columns)],
                  [str(g) for g in range(columns)])
    ax.set_yticks([-r * cell_h + cell_h * 0.45 for r in range(len(shown))],
                  [_node_label(n.index, n.hostname, n.node_type.name, cluster) for n in shown])
    ax.set_xlabel("GPU index on the node")
    ax.set_ylabel("node")
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    note = "" if len(shown) == len(nodes) else f" (first {len(shown)} of {len(nodes)} nodes)"
    ax.set_title(f"{title}{note}\n{layout.compact()}, order {'-'.join(candidate.mesh_order)}",
                 fontsize=9)
    n_groups = len(set(groups.values()))
    legend = [Patch(facecolor=cmap(i % cmap.N), edgecolor="black", label=f"TP group {i}")
              for i in range(min(n_groups, LEGEND_GROUPS))]
    if n_groups > LEGEND_GROUPS:
        legend.append(Patch(facecolor="white", edgecolor="white",
                            label=f"... {n_groups} TP groups (colours repeat every {cmap.N})"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              title=f"colour = TP group (TP={layout.tp})\nrN = global rank", title_fontsize=7,
              frameon=False)
    paths = _save(fig, stem, formats)
    plt.close(fig)
    return paths


def _dark(rgba: tuple[float, ...]) -> bool:
    """Whether black text would be hard to read on this colour (ITU-R BT.601 luma)."""
    red, green, blue = rgba[:3]
    return 0.299 * red + 0.587 * green + 0.114 * blue < 0.5


def _node_label(index: int, hostname: str | None, node_type: str, cluster: Cluster) -> str:
    name = hostname or f"node {index}"
    return f"{name} ({node_type})" if len(cluster.node_types) > 1 else name


def plot_breakdown(estimates: Sequence[tuple[str, Estimate]], stem: Path, title: str,
                   formats: Sequence[str] = FORMATS) -> list[Path]:
    """Stacked bars of step-time parts, one bar per candidate, beside the same bars without
    compute (where layouts differ most); returns the written paths."""
    plt = _pyplot()
    fields = [f for f in BREAKDOWN_LABELS if any(getattr(e.breakdown, f) > 0 for _, e in estimates)]
    width = max(9.0, 2.2 * len(estimates) + 3.5)
    fig, (full, rest) = plt.subplots(1, 2, figsize=(width, 5.0), width_ratios=(3, 2))
    long_labels = [f"{name}\n{_short(e)}" for name, e in estimates]
    short_labels = [name for name, _ in estimates]
    panels = ((full, fields, long_labels),
              (rest, [f for f in fields if f != "compute_s"], short_labels))
    for ax, parts, labels in panels:
        bottoms = [0.0] * len(estimates)
        for f in parts:
            values = [getattr(e.breakdown, f) for _, e in estimates]
            ax.bar(labels, values, bottom=bottoms, color=PART_COLOURS[f],
                   label=BREAKDOWN_LABELS[f], edgecolor="white", linewidth=0.5)
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        ax.set_ylim(0, max(max(bottoms), 1e-9) * 1.2)
        ax.tick_params(axis="x", labelsize=6.5)
        if ax is full:
            for i, (_, e) in enumerate(estimates):
                ax.text(i, bottoms[i], f"{e.step_time_s:.3g} s\nMFU {e.mfu * 100:.0f}%",
                        ha="center", va="bottom", fontsize=7)
    full.set_ylabel("predicted time per step (s)")
    rest.set_ylabel("seconds per step")
    full.set_title("whole step", fontsize=9)
    rest.set_title("everything but compute (where layouts differ)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    handles, names = full.get_legend_handles_labels()
    rest.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.02, 1.0),
                fontsize=7, frameon=False, title="step-time part", title_fontsize=7)
    paths = _save(fig, stem, formats)
    plt.close(fig)
    return paths


def _short(e: Estimate) -> str:
    lay = e.layout
    text = f"TP{lay.tp} PP{lay.pp} DP{lay.dp}"
    if lay.cp > 1:
        text += f" CP{lay.cp}"
    if lay.ep > 1:
        text += f" EP{lay.ep}"
    recompute = "no" if lay.recompute == "none" else lay.recompute
    return text + f"\nmbs{lay.micro_batch_size} ZeRO-{lay.zero_stage}\n{recompute} recompute"


def plot_recommendation(rec: Recommendation, out_dir: Path,
                        formats: Sequence[str] = FORMATS) -> list[Path]:
    """``plot_plan`` with the baseline (published recipe or engineer's rule) as an extra bar
    (what --plot draws)."""
    extra = []
    if rec.baseline is not None and rec.baseline.estimate is not None:
        label = "published\nrecipe" if rec.baseline.recipe is not None else "engineer's\nrule"
        extra.append((label, rec.baseline.estimate))
    return plot_plan(rec.plan, out_dir, extra, formats)


def plot_plan(plan: Plan, out_dir: Path, extra: Sequence[tuple[str, Estimate]] = (),
              formats: Sequence[str] = FORMATS) -> list[Path]:
    """The rank map of #1 and the breakdown chart of the top K (plus ``extra`` rows)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    best = plan.candidates[0]
    title = f"{plan.model.name}: rank map of #1"
    paths = plot_rank_map(best, plan.cluster, out_dir / "rankmap", title, formats)
    rows = [(f"#{i}", c) for i, c in enumerate(plan.candidates, 1)]
    rows += list(extra)
    chart_title = (f"{plan.model.name} on {plan.num_gpus} GPUs: step-time breakdown of the top "
                   f"{len(plan.candidates)}")
    paths += plot_breakdown(rows, out_dir / "breakdown", chart_title, formats)
    return paths
