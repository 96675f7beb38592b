"""CP-SAT choice over the costed table: constraints as linear rows, top K by no-good cuts.

The step time is not linear in the degrees (bubbles, collectives, memory all interact), so it is
precomputed per table row, and CP-SAT owns what is linear: exactly one row, the attribute values
that row implies (tp, pp, ... as integer variables), the degrees multiplying to the GPU count,
the NVLink rule, the job's constraints, memory <= capacity, and the objective. The top K come
from re-solving with each pick and its *equivalents* (same degrees, step time within
``KNOB_TOLERANCE``: the knobs that differ do not matter to the model) cut off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from placer.solver.cpsat import deterministic_solver
from placer.solver.space import RECOMPUTE_MODES
from placer.solver.table import Row
from placer.spec.job import DegreeConstraint, Job
from placer.spec.layout import Layout

KNOB_TOLERANCE = 0.005
"""Two rows with the same degrees whose predicted step times differ by less than this fraction
are one candidate: the cost model cannot tell them apart beyond its own accuracy."""

TIME_QUANTUM_S = 1e-6
"""Objective resolution: step times are integers of microseconds in the CP-SAT model."""

MEMORY_QUANTUM_BYTES = 2**20
"""Memory constraint resolution (MiB); rounding is up for use and down for capacity."""


@dataclass(frozen=True)
class Selection:
    picks: list[int]
    status: str
    solves: int


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


def _post_constraint(model: cp_model.CpModel, var: cp_model.IntVar,
                     constraint: DegreeConstraint) -> None:
    values = _encoded(constraint)
    op = constraint.op
    if op == "in":
        model.add_allowed_assignments([var], [(v,) for v in values])
    elif op == "=":
        model.add(var == values[0])
    elif op == "!=":
        model.add(var != values[0])
    elif op == "<=":
        model.add(var <= values[0])
    elif op == ">=":
        model.add(var >= values[0])
    elif op == "<":
        model.add(var < values[0])
    else:
        model.add(var > values[0])


def select_top(rows: Sequence[Row], job: Job, num_gpus_by_row: Sequence[int], *, k: int,
               max_tp: int | None, time_limit_s: float) -> Selection:
    """Indices of the best ``k`` distinct rows, best first (rows must be in a stable order)."""
    if not rows:
        return Selection([], "EMPTY", 0)
    model = cp_model.CpModel()
    pick = [model.new_bool_var(f"row_{i}") for i in range(len(rows))]
    model.add_exactly_one(pick)
    keys = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "mbs", "zero", "recompute", "sp")
    attrs: dict[str, cp_model.IntVar] = {}
    for key in keys:
        values = [_attribute(r.layout, key) for r in rows]
        var = model.new_int_var(min(values), max(values), key)
        model.add(var == sum(v * x for v, x in zip(values, pick, strict=True) if v))
        attrs[key] = var
    # The degrees multiply to the GPUs each row uses (all of them on regular clusters).
    used = model.new_int_var(min(num_gpus_by_row), max(num_gpus_by_row), "gpus")
    model.add(used == sum(n * x for n, x in zip(num_gpus_by_row, pick, strict=True)))
    tp_pp = model.new_int_var(1, max(num_gpus_by_row), "tp_pp")
    dp_cp = model.new_int_var(1, max(num_gpus_by_row), "dp_cp")
    model.add_multiplication_equality(tp_pp, [attrs["tp"], attrs["pp"]])
    model.add_multiplication_equality(dp_cp, [attrs["dp"], attrs["cp"]])
    model.add_multiplication_equality(used, [tp_pp, dp_cp])
    if max_tp is not None:
        model.add(attrs["tp"] <= max_tp)
    for constraint in job.constraints:
        _post_constraint(model, attrs[constraint.key], constraint)
    # Memory: the chosen row's peak fits its GPUs' capacity.
    q = MEMORY_QUANTUM_BYTES
    slack = [r.capacity_bytes // q - (-(-r.memory_bytes // q)) for r in rows]
    model.add(sum(s * x for s, x in zip(slack, pick, strict=True)) >= 0)
    # Objective: microseconds, ties broken by the row's position in the stable order.
    n = len(rows)
    cost = [round(r.step_time_s / TIME_QUANTUM_S) * n + i for i, r in enumerate(rows)]
    model.minimize(sum(c * x for c, x in zip(cost, pick, strict=True)))

    solver = deterministic_solver(time_limit_s)
    picks: list[int] = []
    statuses: list[str] = []
    solves = 0
    while len(picks) < k:
        status = solver.solve(model)
        solves += 1
        statuses.append(solver.status_name(status))
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        best = next(i for i, x in enumerate(pick) if solver.boolean_value(x))
        picks.append(best)
        chosen = rows[best]
        for i, row in enumerate(rows):
            if i == best or (row.degrees == chosen.degrees and abs(
                    row.step_time_s - chosen.step_time_s) <= KNOB_TOLERANCE * chosen.step_time_s):
                model.add(pick[i] == 0)
    first = statuses[0] if statuses else "EMPTY"
    return Selection(picks, first, solves)


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
