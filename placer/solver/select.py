"""The choice over the costed table: the best distinct rows under the job's constraints.

Each row is one costed layout, so everything a pick must satisfy is a constant of its row: the
degrees multiply to the GPUs the row uses, TP stays within the NVLink limit, the job's
constraints on degrees and knobs, and memory (in MiB, rounded up for use and down for capacity).
The choice was a CP-SAT model, one-hot over the rows with those rows as linear constraints and the
step time (integer microseconds, ties broken by row position) as the objective; a one-hot model
over constant rows has as its optimum the cheapest row that passes every row-wise check, so a scan
of the rows in objective order computes it exactly, without a solver (whose import alone took
~0.65 s of every command). The top K come as they did from re-solving with each pick and its
*equivalents* (same degrees, step time within ``KNOB_TOLERANCE``: the knobs that differ do not
matter to the model) cut off: the next row of the scan not yet cut. tests/test_solver_select.py
builds that CP-SAT model and checks the scan against it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from placer.solver.space import RECOMPUTE_MODES
from placer.solver.table import Row
from placer.spec.job import DegreeConstraint, Job
from placer.spec.layout import Layout

KNOB_TOLERANCE = 0.005
"""Two rows with the same degrees whose predicted step times differ by less than this fraction
are one candidate: the cost model cannot tell them apart beyond its own accuracy."""

TIME_QUANTUM_S = 1e-6
"""Objective resolution: step times are compared in integer microseconds, ties by row position."""

MEMORY_QUANTUM_BYTES = 2**20
"""Memory check resolution (MiB); rounding is up for use and down for capacity."""

SELECTION_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp")
"""The row attributes a constraint can name."""

_OPERATORS: dict[str, Callable[[int, int], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge,
    "<": operator.lt, ">": operator.gt}


@dataclass(frozen=True)
class Selection:
    picks: list[int]
    status: str
    solves: int
    """Choices made: one per pick, and one more that found nothing when fewer than k exist."""


def _attribute(layout: Layout, key: str) -> int:
    """Integer value of a layout attribute (recompute and sp encoded as indices)."""
    if key == "mbs":
        return layout.micro_batch_size
    if key == "zero":
        return layout.zero_stage
    if key == "recompute":
        return RECOMPUTE_MODES.index(layout.recompute)
    if key == "sp":
        return int(layout.sequence_parallel)
    return int(getattr(layout, key))


def _encoded(constraint: DegreeConstraint) -> list[int]:
    values = []
    for v in constraint.values:
        if constraint.key == "recompute":
            values.append(RECOMPUTE_MODES.index(str(v)))
        elif constraint.key == "sp":
            values.append(1 if v == "on" else 0)
        else:
            values.append(int(v))
    return values


def _allows(constraint: DegreeConstraint, value: int) -> bool:
    values = _encoded(constraint)
    if constraint.op == "in":
        return value in values
    return _OPERATORS[constraint.op](value, values[0])


def memory_fits(row: Row) -> bool:
    """The row's peak within its GPUs' capacity, in whole MiB (use rounded up)."""
    q = MEMORY_QUANTUM_BYTES
    return row.capacity_bytes // q - (-(-row.memory_bytes // q)) >= 0


def admissible(row: Row, num_gpus: int, job: Job, max_tp: int | None) -> bool:
    """Whether a row passes every check a pick must pass."""
    layout = row.layout
    if layout.tp * layout.pp * layout.dp * layout.cp != num_gpus:
        return False
    if max_tp is not None and layout.tp > max_tp:
        return False
    if not all(_allows(c, _attribute(layout, c.key)) for c in job.constraints):
        return False
    return memory_fits(row)


def select_top(rows: Sequence[Row], job: Job, num_gpus_by_row: Sequence[int], *, k: int,
               max_tp: int | None) -> Selection:
    """Indices of the best ``k`` distinct rows, best first (rows must be in a stable order)."""
    if not rows or k <= 0:
        return Selection([], "EMPTY", 0)
    order = sorted((i for i, row in enumerate(rows)
                    if admissible(row, num_gpus_by_row[i], job, max_tp)),
                   key=lambda i: (round(rows[i].step_time_s / TIME_QUANTUM_S), i))
    picks: list[int] = []
    cut: set[int] = set()
    for best in order:
        if len(picks) == k:
            break
        if best in cut:
            continue
        picks.append(best)
        chosen = rows[best]
        cut.update(i for i, row in enumerate(rows) if row.degrees == chosen.degrees and abs(
            row.step_time_s - chosen.step_time_s) <= KNOB_TOLERANCE * chosen.step_time_s)
    solves = len(picks) + (1 if len(picks) < k else 0)
    return Selection(picks, "OPTIMAL" if picks else "INFEASIBLE", solves)


def greedy_top(rows: Sequence[Row], k: int) -> list[int]:
    """What ``select_top`` computes, by plain sorting: the reference for cross-checks."""
    order = sorted(range(len(rows)), key=lambda i: (rows[i].key, i))
    out: list[int] = []
    excluded: set[int] = set()
    for i in order:
        if len(out) == k:
            break
        if i in excluded or rows[i].memory_bytes > rows[i].capacity_bytes:
            continue
        out.append(i)
        chosen = rows[i]
        excluded.update(j for j, row in enumerate(rows) if row.degrees == chosen.degrees and abs(
            row.step_time_s - chosen.step_time_s) <= KNOB_TOLERANCE * chosen.step_time_s)
    return out
