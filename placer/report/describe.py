"""Short human spellings of layouts, sizes, times and links, shared by tables and explanations."""

from __future__ import annotations

from placer.spec.cluster import Cluster
from placer.spec.layout import Layout

BREAKDOWN_LABELS = {
    "compute_s": "compute",
    "recompute_s": "recomputation",
    "tp_exposed_s": "exposed TP communication",
    "cp_exposed_s": "exposed CP exchange",
    "ep_exposed_s": "MoE all-to-all",
    "pp_bubble_s": "pipeline bubble",
    "pp_p2p_s": "pipeline sends",
    "dp_exposed_s": "exposed gradient reduction",
    "zero_exposed_s": "ZeRO-2/3 gradient reduce-scatters and ZeRO-3 gathers",
    "optimizer_s": "optimizer step",
}
"""Every StepBreakdown field, in the order tables and charts show them."""

BREAKDOWN_SHORT = {
    "compute_s": "compute", "recompute_s": "recomp", "tp_exposed_s": "TP", "cp_exposed_s": "CP",
    "ep_exposed_s": "EP a2a", "pp_bubble_s": "PP bubble", "pp_p2p_s": "PP p2p",
    "dp_exposed_s": "DP", "zero_exposed_s": "ZeRO-2/3", "optimizer_s": "optim",
}

_NETWORK_NAMES = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet",
                  "none": "the host network"}
SHAPE_FIELDS = ("tp", "pp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage",
                "recompute", "sequence_parallel")
"""Layout fields that define its shape; ``dp`` follows from them and the GPU count."""


def seconds(value_s: float) -> str:
    """A duration with about three significant figures, in s or ms (``9.87 s``, ``512 ms``)."""
    value, unit = (value_s, "s") if abs(value_s) >= 1 else (value_s * 1e3, "ms")
    decimals = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{decimals}f} {unit}"


def count(value: float) -> str:
    """Large counts as 1.23M / 456k."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def percent(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def layout_text(layout: Layout) -> str:
    """``TP=8 PP=4 DP=2`` plus every knob that is not at its plain default."""
    parts = [f"TP={layout.tp}", f"PP={layout.pp}", f"DP={layout.dp}"]
    if layout.cp > 1:
        parts.append(f"CP={layout.cp}")
    if layout.ep > 1:
        parts.append(f"EP={layout.ep}")
    if layout.etp > 1:
        parts.append(f"ETP={layout.etp}")
    if layout.vpp > 1:
        parts.append(f"VPP={layout.vpp}")
    parts.append(f"mbs={layout.micro_batch_size}")
    parts.append(f"ZeRO-{layout.zero_stage}" if layout.zero_stage else "no ZeRO")
    parts.append(f"{layout.recompute} recompute" if layout.recompute != "none" else "no recompute")
    if layout.sequence_parallel:
        parts.append("SP")
    return ", ".join(parts)


def shape_changes(old: Layout, new: Layout) -> str:
    """What differs in shape, e.g. ``PP=8 (not 4), mbs=2 (not 1)``; empty when the same."""
    names = {"micro_batch_size": "mbs", "zero_stage": "ZeRO", "recompute": "recompute",
             "sequence_parallel": "SP"}
    changes = []
    for field in SHAPE_FIELDS:
        before, after = getattr(old, field), getattr(new, field)
        if before == after:
            continue
        name = names.get(field, field.upper())
        if isinstance(after, bool):
            before, after = ("on" if before else "off"), ("on" if after else "off")
        changes.append(f"{name}={after} (not {before})")
    return ", ".join(changes)


def same_shape(a: Layout, b: Layout) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in SHAPE_FIELDS)


def link_name(link_class: str, cluster: Cluster) -> str:
    """``NVLink``, ``PCIe``, or the network's name (InfiniBand, RoCE, Ethernet)."""
    if link_class == "nvlink":
        return "NVLink"
    if link_class == "pcie":
        return "PCIe"
    if link_class == "network":
        return _NETWORK_NAMES[cluster.network.kind]
    return "no link (one GPU)"


def link_scope(link_class: str) -> str:
    return {"nvlink": "inside an NVLink domain", "pcie": "inside a node, no NVLink",
            "network": "across nodes"}.get(link_class, "")
