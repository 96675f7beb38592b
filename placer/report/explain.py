"""The plain-language why of a recommendation: sentences a user can defend to their team.

Everything here is a pure function of the ranked candidates, the common default and the what-if
results, so the same plan always reads the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from placer.cost.profile import bounding_node_type
from placer.cost.validity import MODEL_ERROR, beyond_measured_mfu
from placer.dims import Dim
from placer.report.baseline import RULE_TEXT, Baseline
from placer.report.describe import (
    BREAKDOWN_LABELS,
    count,
    layout_text,
    link_name,
    link_scope,
    percent,
    same_shape,
    seconds,
    shape_changes,
)
from placer.report.whatif import WhatIf
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, layout_problem
from placer.spec.model import Model
from placer.spec.results import Estimate
from placer.units import GIB, gib

TIE_FRACTION = 0.005
"""Step times closer than 0.5% are called a tie: below what the cost model can resolve."""
REASON_SHARE = 0.1
"""A breakdown part is named as a reason when it moves by at least this share of the gap."""
LINK_DIMS = (Dim.TP, Dim.CP, Dim.EP, Dim.PP, Dim.DP)


def explain(model: Model, cluster: Cluster, job: Job, candidates: list[Estimate],
            baseline: Baseline | None, what_ifs: list[WhatIf]) -> list[str]:
    """The explanation of the first candidate, one sentence per line."""
    best = candidates[0]
    lines = [headline(best, job)]
    unmeasured = unmeasured_mfu(best, cluster, job)
    if unmeasured:
        lines.append(unmeasured)
    idle = cluster.num_gpus - best.layout.num_gpus
    if idle > 0:
        lines.append(f"It uses {best.layout.num_gpus} of the {cluster.num_gpus} usable GPUs; the "
                     f"other {idle} stay idle because no layout over more of them is both valid "
                     f"(data parallelism must divide the global batch of "
                     f"{job.global_batch_size}, and TP the attention heads) and faster.")
    if len(candidates) > 1:
        lines.append(versus(best, candidates[1], "#2"))
    if baseline is not None:
        lines.append(versus_default(model, job, best, baseline, candidates))
    links = links_sentence(best, cluster)
    if links:
        lines.append(links)
    lines.extend(what_if_sentences(best, what_ifs))
    return lines


def unmeasured_mfu(best: Estimate, cluster: Cluster, job: Job) -> str | None:
    """The sentence saying #1's MFU is beyond what any measured run on its GPU reached."""
    node = bounding_node_type(cluster)
    why = beyond_measured_mfu(best.mfu, node.gpu.name, job.precision,
                              best.layout.num_gpus > node.gpus_per_node)
    if why is None:
        return None
    if why.startswith("no measured"):
        return f"Unvalidated: {why}, so this figure rests on the cost model alone."
    return (f"Unvalidated: {why}; no run the cost model was checked against went this fast, so "
            "this figure rests on the model alone.")


def headline(best: Estimate, job: Job | None = None) -> str:
    """The pick in one sentence; memory as used of usable, with the headroom kept beyond it."""
    mem = best.memory
    split = getattr(best, "stage_layers", None)
    stages = f"; layers per pipeline stage {'/'.join(map(str, split))}" if split else ""
    spare = gib(mem.capacity_bytes - mem.total_bytes)
    if job is not None and job.memory_headroom > 0:
        kept = mem.capacity_bytes * job.memory_headroom / (1.0 - job.memory_headroom)
        spare = f"{spare} GiB to spare beyond the {gib(kept)} GiB headroom kept free"
    else:
        spare = f"{spare} GiB free"
    return (f"Best: {layout_text(best.layout)} (ranks ordered {'-'.join(best.mesh_order)}"
            f"{stages}): {seconds(best.step_time_s)} per step, {count(best.tokens_per_s)} "
            f"tokens/s, {percent(best.mfu)} MFU, {gib(mem.total_bytes)} of "
            f"{gib(mem.capacity_bytes)} GiB usable per GPU ({spare}).")


def gain(best: Estimate, other: Estimate) -> float:
    """How much more throughput ``best`` has than ``other`` (0.1 = 10% more tokens/s)."""
    return other.step_time_s / best.step_time_s - 1.0


def reasons(best: Estimate, other: Estimate) -> str:
    """Which parts of the step explain the difference, e.g. ``1.2 s less pipeline bubble``."""
    gap = abs(other.step_time_s - best.step_time_s)
    diffs = [(getattr(other.breakdown, f) - getattr(best.breakdown, f), f)
             for f in BREAKDOWN_LABELS]
    floor = max(gap * REASON_SHARE, 1e-6)
    saved = sorted(((d, f) for d, f in diffs if d >= floor), key=lambda x: (-x[0], x[1]))[:2]
    paid = sorted(((d, f) for d, f in diffs if -d >= floor), key=lambda x: (x[0], x[1]))[:1]
    parts = [f"{seconds(d)} less on {BREAKDOWN_LABELS[f]}" for d, f in saved]
    costs = [f"{seconds(-d)} more on {BREAKDOWN_LABELS[f]}" for d, f in paid]
    if parts and costs:
        return f"it spends {' and '.join(parts)}, at the cost of {costs[0]}"
    if parts:
        return f"it spends {' and '.join(parts)}"
    if costs:
        return f"it spends {costs[0]}, but less elsewhere"
    return "the difference is spread over the whole step"


def _memory_note(best: Estimate, other: Estimate, name: str) -> str:
    delta = best.peak_memory_bytes - other.peak_memory_bytes
    if abs(delta) < GIB:
        return ""
    if delta > 0:
        return (f"; {name} would leave more memory free ({gib(other.peak_memory_bytes)} vs "
                f"{gib(best.peak_memory_bytes)} GiB per GPU)")
    return (f"; it also needs {gib(-delta)} GiB less memory per GPU than {name}")


def versus(best: Estimate, other: Estimate, name: str) -> str:
    """What the first candidate gains over ``other``."""
    label = f"{name} ({layout_text(other.layout)})"
    if same_shape(best.layout, other.layout) and best.mesh_order != other.mesh_order:
        label = f"{name} (the same degrees with ranks ordered {'-'.join(other.mesh_order)})"
    ratio = gain(best, other)
    memory = _memory_note(best, other, name)
    if ratio < TIE_FRACTION:
        return (f"Over {label}: a tie within {percent(TIE_FRACTION)} "
                f"({seconds(other.step_time_s)} per step){memory or '; either is a sound choice'}.")
    return (f"Over {label}: {percent(ratio)} more tokens/s "
            f"({seconds(other.step_time_s)} per step); {reasons(best, other)}{memory}.")


def same_degrees(a: Layout, b: Layout) -> bool:
    """The same parallel degrees (knobs such as VPP or recompute may differ)."""
    return all(getattr(a, d) == getattr(b, d) for d in ("tp", "pp", "dp", "cp", "ep", "etp"))


def _baseline_label(baseline: Baseline) -> str:
    if baseline.recipe is not None:
        source = baseline.recipe.source
        where = f"{source.repo} {source.path}" if source.repo and source.path else source.url
        return f"the published recipe {baseline.recipe.id} ({where})"
    return f"the engineer's rule ({RULE_TEXT})"


def versus_default(model: Model, job: Job, best: Estimate, baseline: Baseline,
                   candidates: Sequence[Estimate] = ()) -> str:
    """What the first candidate gains over the baseline (the stack's published recipe or the
    engineer's rule); a gain within the model's measured error is a tie."""
    if baseline.layout is None or baseline.estimate is None:
        return f"The engineer's rule ({RULE_TEXT}) is not an option: {baseline.note}."
    default = baseline.estimate
    label = _baseline_label(baseline)
    short = "the recipe" if baseline.recipe is not None else "the rule"
    spelled = f"{label}: {layout_text(baseline.layout)}"
    if baseline.recipe is None and baseline.note:
        spelled += f" ({baseline.note})"
    rank = next((i for i, c in enumerate(candidates, 1) if same_shape(c.layout, baseline.layout)),
                None)
    degrees = next((i for i, c in enumerate(candidates, 1)
                    if same_degrees(c.layout, baseline.layout)), None)
    if same_shape(best.layout, baseline.layout):
        return f"This is {spelled}; placer confirms it."
    in_top = f" It is #{rank} here." if rank is not None else ""
    if rank is None and degrees is not None:
        changed = shape_changes(baseline.layout, candidates[degrees - 1].layout)
        in_top = f" #{degrees} is it with {changed}."
    ratio = gain(best, default)
    if ratio < -TIE_FRACTION:
        problem = layout_problem(baseline.layout, model, job, best.layout.num_gpus)
        why = f"your constraints rule it out ({problem[2]})" if problem else (
            "the search did not rank it first")
        return (f"{spelled[0].upper()}{spelled[1:]} would be {percent(-ratio)} faster "
                f"({seconds(default.step_time_s)} per step), but {why}.{in_top}")
    if ratio < MODEL_ERROR:
        return (f"Against {spelled}: a tie, {percent(ratio)} more tokens/s predicted "
                f"({seconds(default.step_time_s)} per step), within the cost model's measured "
                f"error of {percent(MODEL_ERROR)}; either is a sound choice"
                f"{_memory_note(best, default, short)}.{in_top}")
    return (f"Against {spelled}: {percent(ratio)} more tokens/s predicted "
            f"({seconds(default.step_time_s)} per step, {percent(default.mfu)} MFU), beyond the "
            f"model's measured error of {percent(MODEL_ERROR)}; {reasons(best, default)}."
            f"{in_top}")


def links_sentence(best: Estimate, cluster: Cluster) -> str:
    """Which link each parallel dimension crosses, e.g. ``TP=8 on NVLink (inside ...)``."""
    parts = []
    for dim in LINK_DIMS:
        degree = getattr(best.layout, dim)
        link = best.links.get(dim)
        if degree <= 1 or link is None or link == "local":
            continue
        parts.append(f"{dim.upper()}={degree} on {link_name(link, cluster)} ({link_scope(link)})")
    if not parts:
        return ""
    return "Links: " + "; ".join(parts) + "."


def what_if_sentences(best: Estimate, what_ifs: list[WhatIf]) -> list[str]:
    """One sentence per variant that changes the answer, then one for those that do not."""
    holds = holds_sentence(best, what_ifs)
    return change_sentences(best, what_ifs) + ([holds] if holds else [])


def change_sentences(best: Estimate, what_ifs: list[WhatIf]) -> list[str]:
    """One sentence per variant that changes the answer, in the variants' order (a longer list
    of variants only adds sentences: the command prints each as its variant is solved)."""
    lines: list[str] = []
    for what in what_ifs:
        lead = "What would change the answer: at" if not lines else "At"
        if what.layout is None:
            lines.append(f"{lead} {what.label} no layout works ({what.problem}).")
        elif not same_shape(what.layout, best.layout):
            time = f", {seconds(what.step_time_s)} per step" if what.step_time_s else ""
            lines.append(f"{lead} {what.label}, {shape_changes(best.layout, what.layout)} wins "
                         f"({layout_text(what.layout)}{time}).")
    return lines


def holds_sentence(best: Estimate, what_ifs: list[WhatIf]) -> str:
    """The variants that keep the answer, in one sentence ("" if none does)."""
    holds = [w.label for w in what_ifs if w.layout is not None and same_shape(w.layout,
                                                                            best.layout)]
    if not holds:
        return ""
    joined = holds[0] if len(holds) == 1 else ", ".join(holds[:-1]) + " and " + holds[-1]
    return f"The answer holds at {joined}."
