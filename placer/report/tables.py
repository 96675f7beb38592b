"""The human output of recommend-layout: rich tables of the top K, breakdowns, memory, the why.

Rendering is deterministic: fixed width, no timing, no colour unless the console is a terminal.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator, Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from placer.cost.validity import MODEL_ERROR
from placer.report.baseline import Baseline
from placer.report.describe import BREAKDOWN_SHORT, count, percent, seconds
from placer.report.explain import change_sentences, holds_sentence
from placer.report.plan import Recommendation
from placer.report.whatif import WhatIf
from placer.spec.cluster import Cluster
from placer.spec.results import Estimate, Plan
from placer.units import gib

WIDTH = 120


def cluster_text(cluster: Cluster) -> str:
    """``8 x dgx-h100 (64 GPUs: H100-SXM-80GB)``, pools joined with ``+``."""
    pools = " + ".join(f"{p.count} x {p.node_type}" for p in cluster.pools)
    gpus = sorted({cluster.node_type_named(p.node_type).gpu.name for p in cluster.pools})
    excluded = len(cluster.excluded_gpus)
    health = f", {excluded} excluded" if excluded else ""
    return f"{pools} ({cluster.num_gpus:,} usable GPUs{health}: {', '.join(gpus)})"


def header_rows(plan: Plan) -> list[tuple[str, str]]:
    """(label, text) rows: the inputs, the defaults used, the size of the search."""
    job = plan.job
    tokens = job.seq_len * job.global_batch_size
    rows = [
        ("model", plan.model.name),
        ("cluster", cluster_text(plan.cluster)),
        ("job", f"seq_len {job.seq_len:,}, global batch {job.global_batch_size:,} sequences "
                f"({count(tokens)} tokens/step), {job.precision}"),
    ]
    if job.constraints:
        rows.append(("rules", ", ".join(str(c) for c in job.constraints)))
    for index, line in enumerate(plan.defaults_used):
        rows.append(("defaults used" if index == 0 else "", line))
    search = plan.search
    if search is not None:
        rows.append(("search", f"{search.layouts_considered:,} layouts considered, "
                               f"{search.layouts_feasible:,} fit ({search.solver_status})"))
    return rows


def _rows(plan: Plan, baseline: Baseline | None) -> list[tuple[str, Estimate]]:
    rows: list[tuple[str, Estimate]] = [(f"{i}", c) for i, c in enumerate(plan.candidates, 1)]
    if baseline is not None and baseline.estimate is not None:
        rows.append((baseline_label(baseline), baseline.estimate))
    return rows


def baseline_label(baseline: Baseline) -> str:
    """The baseline row's name: ``recipe`` (the stack's published recipe) or ``rule``."""
    return "recipe" if baseline.recipe is not None else "rule"


def _table() -> Table:
    return Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)


def versus_baseline(est: Estimate, base: Estimate) -> str:
    """Predicted throughput over the baseline's, ``tie`` within the model's measured error."""
    gain = base.step_time_s / est.step_time_s - 1.0
    if abs(gain) < MODEL_ERROR:
        return f"{gain:+.1%} tie"
    return f"{gain:+.1%}"


def candidates_table(rows: Sequence[tuple[str, Estimate]],
                     base: Estimate | None = None) -> Table:
    """One row per candidate; with ``base`` a "vs base" column (ties marked)."""
    table = _table()
    for name in ("#", "TP", "PP", "DP", "CP", "EP", "VPP", "mbs", "ZeRO", "recompute", "SP"):
        table.add_column(name, justify="left" if name in ("#", "recompute") else "right")
    for name in ("step", "tokens/s", "TFLOP/s", "MFU", "GiB/GPU", "free"):
        table.add_column(name, justify="right")
    if base is not None:
        table.add_column("vs base", justify="right")
    for label, est in rows:
        lay, mem = est.layout, est.memory
        ep = f"{lay.ep}" if lay.etp == 1 else f"{lay.ep}x{lay.etp}"
        free = mem.capacity_bytes - mem.total_bytes
        table.add_row(label, str(lay.tp), str(lay.pp), str(lay.dp), str(lay.cp), ep,
                      str(lay.vpp), str(lay.micro_batch_size), str(lay.zero_stage), lay.recompute,
                      "on" if lay.sequence_parallel else "off", seconds(est.step_time_s),
                      count(est.tokens_per_s), f"{est.tflops_per_gpu:.0f}", percent(est.mfu),
                      f"{gib(mem.total_bytes)}/{gib(mem.capacity_bytes)}",
                      gib(free) if est.fits else "OOM",
                      *([] if base is None else [versus_baseline(est, base)]))
    return table


def breakdown_table(rows: Sequence[tuple[str, Estimate]]) -> tuple[str, Table]:
    """Per-candidate step-time parts; parts that are zero for every row are left out."""
    fields = [f for f in BREAKDOWN_SHORT
              if any(getattr(est.breakdown, f) > 0 for _, est in rows)]
    in_ms = max(est.step_time_s for _, est in rows) < 1
    unit, scale, fmt = ("ms", 1e3, "{:.1f}") if in_ms else ("s", 1.0, "{:.3f}")
    table = _table()
    table.add_column("#")
    for f in fields:
        table.add_column(BREAKDOWN_SHORT[f], justify="right")
    table.add_column("step", justify="right")
    for label, est in rows:
        values = [fmt.format(getattr(est.breakdown, f) * scale) for f in fields]
        table.add_row(label, *values, fmt.format(est.step_time_s * scale))
    return f"Where the step time goes ({unit})", table


def memory_table(rows: Sequence[tuple[str, Estimate]]) -> Table:
    table = _table()
    columns = ("#", "weights", "grads", "optimizer", "activations", "logits", "MoE buf",
               "other", "total", "usable", "stage")
    for name in columns:
        table.add_column(name, justify="left" if name == "#" else "right")
    for label, est in rows:
        m = est.memory
        other = m.framework_bytes + m.fragmentation_bytes + m.overhead_bytes
        table.add_row(label, *(gib(v) for v in (
            m.weights_bytes, m.gradients_bytes, m.optimizer_bytes, m.activations_bytes,
            m.logits_bytes, m.moe_buffers_bytes, other, m.total_bytes, m.capacity_bytes)),
            str(m.worst_stage))
    return table


def _bullets(lines: Sequence[str], mark: str = "-") -> Table:
    """Wrapped lines with a hanging indent."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for line in lines:
        grid.add_row(mark, line)
    return grid


def render(rec: Recommendation, console: Console) -> None:
    """Print the whole human report of a recommendation."""
    render_head(rec, console, rec.plan.explanation)
    render_tail(rec, console)


def render_head(rec: Recommendation, console: Console, explanation: Sequence[str]) -> None:
    """The report up to the last line of "Why #1" (``explanation``): what the command prints as
    soon as the main search is done, before the what-ifs."""
    plan = rec.plan
    header = Table.grid(padding=(0, 1))
    header.add_column(no_wrap=True)
    header.add_column()
    for row in header_rows(plan):
        header.add_row(*row)
    console.print(header)
    rows = _rows(plan, rec.baseline)
    title = f"Top {len(plan.candidates)} layouts, best first"
    if rec.baseline is not None and len(rows) > len(plan.candidates):
        if rec.baseline.recipe is not None:
            title += f" ('recipe': {rec.baseline.recipe.id}, DP scaled to these GPUs)"
        else:
            title += " ('rule': TP and EP in the NVLink domain, the smallest PP that fits)"
    breakdown_title, breakdown = breakdown_table(rows)
    base = rec.baseline.estimate if rec.baseline is not None else None
    sections = [(title, candidates_table(rows, base)), (breakdown_title, breakdown),
                ("Memory per GPU (GiB, most loaded pipeline stage)", memory_table(rows))]
    for heading, table in sections:
        console.print()
        console.print(heading)
        console.print(table)
    console.print()
    console.print("Why #1:")
    console.print(_bullets(explanation))


def render_bullets(lines: Sequence[str], console: Console) -> None:
    """More lines of "Why #1", as ``render_head`` prints them."""
    if lines:
        console.print(_bullets(lines))


def render_tail(rec: Recommendation, console: Console) -> None:
    """The report after "Why #1": the search notes and the rank order of #1."""
    plan = rec.plan
    best = plan.candidates[0]
    if best.why:
        console.print()
        console.print("Search notes on #1 (--json has every candidate's):")
        console.print(_bullets(best.why))
    console.print()
    console.print(f"Rank order of #1: {'-'.join(best.mesh_order)} (innermost first). "
                  f"--json prints the whole plan with rank maps; --emit DIR writes it with the "
                  f"launch files; --plot DIR draws it.")


def render_text(rec: Recommendation, width: int = WIDTH) -> str:
    """The human report as plain text, trailing spaces stripped (what the command prints)."""
    return text_of(lambda console: render(rec, console), width)


def text_of(draw: Callable[[Console], None], width: int = WIDTH) -> str:
    """What ``draw`` prints, as plain text with trailing spaces stripped."""
    buffer = io.StringIO()
    draw(make_console(buffer, width))
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())


def stream_text(head: Recommendation, what_ifs: Iterator[WhatIf],
                finish: Callable[[list[WhatIf]], Recommendation], write: Callable[[str], None],
                width: int = WIDTH) -> Recommendation:
    """Write the report while it is computed: everything but the what-ifs as soon as the main
    search is done (``head``), each sentence of a variant that changes the answer as soon as
    that variant is solved, then the rest. ``finish`` turns the solved variants into the final
    recommendation, whose ``render_text`` is exactly what was written."""
    best = head.plan.candidates[0]
    write(text_of(lambda c: render_head(head, c, head.plan.explanation), width))
    solved: list[WhatIf] = []
    written = 0
    for what in what_ifs:
        solved.append(what)
        lines = change_sentences(best, solved)
        write(text_of(lambda c, new=lines[written:]: render_bullets(new, c), width))
        written = len(lines)
    rec = finish(solved)
    holds = holds_sentence(best, solved)
    write(text_of(lambda c: render_bullets([holds] if holds else [], c), width))
    write(text_of(lambda c: render_tail(rec, c), width))
    return rec


def make_console(file: io.TextIOBase | None = None, width: int = WIDTH,
                 stderr: bool = False) -> Console:
    return Console(file=file, width=width, stderr=stderr, highlight=False, soft_wrap=False,
                   emoji=False, markup=False)

