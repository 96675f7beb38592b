"""Which layers recompute and which offload, per pipeline rank.

Megatron's ``--recompute-method block --recompute-num-layers N`` recomputes the first ``N``
layers of every virtual stage and keeps the rest whole (transformer_config.py
``recompute_num_layers``: "the number of transformer layers to recompute within each pipeline
stage"); without ``N`` full recomputation covers every layer. ``--cpu-offloading-num-layers K``
moves the saved activations of ``K`` layers to host memory during the forward and back for the
backward (transformer_config.py ``cpu_offloading``), one layer in flight at a time.
"""

from __future__ import annotations

from placer.spec.layout import Layout


def recomputed_fraction(layout: Layout, num_layers: int, rank: int) -> float:
    """Share of ``rank``'s layers that full recomputation covers (0 without it)."""
    if layout.recompute != "full":
        return 0.0
    if layout.recompute_layers is None:
        return 1.0
    split = layout.pipeline_split(num_layers)
    held = recomputed = 0
    for chunk, size in enumerate(split.chunks):
        if split.rank_of(chunk) == rank:
            held += size
            recomputed += min(size, layout.recompute_layers)
    return recomputed / held if held else 0.0


def offloaded_layers(layout: Layout, layers: int) -> int:
    """Layers of a rank whose saved activations live on the host between forward and backward."""
    return min(layout.offload_layers, layers)
