"""What the cost model's figures can be trusted for: its measured error, and where it was never
checked against a measurement.

- ``MODEL_ERROR``: the mean out-of-sample throughput error of the cost model. Two layouts whose
  predicted throughput differs by less than this are a tie: the model cannot rank them.
- ``unvalidated_mechanisms``: parts of a layout no measured run in the calibration set
  (bench/data/published-runs.json) exercises, so the figure rests on formulas alone.
"""

from __future__ import annotations

from placer.spec.job import Job
from placer.spec.layout import Layout

MODEL_ERROR = 0.19
"""Mean throughput error out of sample: ``bench/accuracy.py`` leave-one-source-out (every
constant fitted on all sources but one, that one predicted), all 130 measured rows of 9 sources:
18.7 % (per source 3.9-36.6 %; in-sample 8.5 %), at commit 3f5f375 (2026-12-01). Update it with
that table's "all" row when the cost model changes; bench/recipes.py prints the error on the
published recipes beside it."""

MIN_VALIDATED_CP_TOKENS = 4096
"""The fewest tokens per context-parallel rank of any measured run: NeMo 24.07's Llama 3 8B and
70B at 8K with CP=2 (bench/data/published-runs.json); the torchtitan CP runs keep 16-32K per
rank. Shorter chunks change the attention kernels' efficiency and the ring's per-step overhead
relative to its compute, which nothing measured pins down."""


def unvalidated_mechanisms(layout: Layout, job: Job) -> list[str]:
    """One phrase per mechanism of ``layout`` the model has no measurement for (empty: none)."""
    found = []
    if layout.cp > 1 and job.seq_len / layout.cp < MIN_VALIDATED_CP_TOKENS:
        found.append(f"CP={layout.cp} at {job.seq_len:,} tokens ({job.seq_len // layout.cp:,} "
                     f"per rank; no measured run has fewer than {MIN_VALIDATED_CP_TOKENS:,})")
    return found


def validated_cp_limit(job: Job) -> int:
    """The largest CP degree whose per-rank chunk a measured run covers (at least 1)."""
    return max(1, job.seq_len // MIN_VALIDATED_CP_TOKENS)
