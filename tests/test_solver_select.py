"""select_top's scan gives what the CP-SAT model it replaced gave: same picks, status, solves.

The CP-SAT model below is the one placer solved until the scan replaced it (placer/solver/
select.py before 2026-12-01 16:40): one-hot over the rows, each row's attributes as linear
equalities, the degrees multiplying to its GPUs, the NVLink TP limit, the job's constraints,
memory in MiB, the step time in integer microseconds with ties broken by row position, and the
top K by cutting each pick and its equivalents. Random tables exercise ties (equal and sub-
microsecond step times), rows over capacity by less than a MiB, rows whose degrees do not
multiply to their GPUs, TP over the limit and every constraint operator.
"""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from ortools.sat.python import cp_model

from placer.solver.cpsat import deterministic_solver
from placer.solver.select import (
    KNOB_TOLERANCE,
    MEMORY_QUANTUM_BYTES,
    SELECTION_KEYS,
    TIME_QUANTUM_S,
    _attribute,
    _encoded,
    select_top,
)
from placer.solver.space import RECOMPUTE_MODES, Degrees
from placer.solver.table import Row
from placer.spec import DegreeConstraint, Job

GIB = 2**30


def cpsat_select(rows: list[Row], job: Job, num_gpus_by_row: list[int], k: int,
                 max_tp: int | None) -> tuple[list[int], str, int]:
    """The replaced CP-SAT selection, as it was."""
    if not rows:
        return [], "EMPTY", 0
    model = cp_model.CpModel()
    pick = [model.new_bool_var(f"row_{i}") for i in range(len(rows))]
    model.add_exactly_one(pick)
    attrs = {}
    for key in SELECTION_KEYS:
        values = [_attribute(r.layout, key) for r in rows]
        var = model.new_int_var(min(values), max(values), key)
        model.add(var == sum(v * x for v, x in zip(values, pick, strict=True) if v))
        attrs[key] = var
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
        var, values, op = attrs[constraint.key], _encoded(constraint), constraint.op
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
    q = MEMORY_QUANTUM_BYTES
    slack = [r.capacity_bytes // q - (-(-r.memory_bytes // q)) for r in rows]
    model.add(sum(s * x for s, x in zip(slack, pick, strict=True)) >= 0)
    n = len(rows)
    cost = [round(r.step_time_s / TIME_QUANTUM_S) * n + i for i, r in enumerate(rows)]
    model.minimize(sum(c * x for c, x in zip(cost, pick, strict=True)))
    solver = deterministic_solver(5.0)
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
    return picks, statuses[0] if statuses else "EMPTY", solves


DEGREES = [Degrees(8, 4, 2, 1), Degrees(4, 4, 4, 1), Degrees(4, 8, 1, 2), Degrees(2, 2, 8, 2),
           Degrees(16, 2, 2, 1), Degrees(1, 8, 8, 1), Degrees(8, 2, 2, 2, ep=2),
           Degrees(4, 2, 4, 2, ep=4, etp=2)]


def _row(rng: random.Random, degrees: Degrees, step_s: float) -> Row:
    layout = degrees.layout(vpp=rng.choice((1, 2, 4)), mbs=rng.choice((1, 2, 4)),
                            zero=rng.choice((0, 1, 2, 3)), recompute=rng.choice(RECOMPUTE_MODES),
                            sp=rng.random() < 0.5)
    capacity = 72 * GIB + 300_000  # usable capacity is rarely whole MiB
    memory = capacity + rng.choice((-10 * GIB, -GIB, -200_000, -1_000, 0, 1, 2**20))
    # select_top reads a row's layout, step time and memory; the estimate behind them is not used
    return Row(layout, step_s, memory, capacity, None)  # type: ignore[arg-type]


def _constraint(rng: random.Random) -> DegreeConstraint:
    key = rng.choice(SELECTION_KEYS)
    if key in ("recompute", "sp"):
        choices: list[int | str] = list(RECOMPUTE_MODES) if key == "recompute" else ["on", "off"]
        op = rng.choice(("=", "!=", "in"))
    else:
        choices = [1, 2, 4, 8]
        op = rng.choice(("<=", ">=", "!=", "=", "<", ">", "in"))
    count = rng.randint(1, min(3, len(choices))) if op == "in" else 1
    return DegreeConstraint(key=key, op=op, values=tuple(rng.sample(choices, count)))  # type: ignore[arg-type]


def _table(seed: int) -> tuple[list[Row], Job, list[int], int, int | None]:
    rng = random.Random(seed)
    steps = [10.0, 10.0 + 1e-7, 10.0 + 4e-7, 10.02, 10.04, 10.3, 11.0, 12.5]
    rows = [_row(rng, rng.choice(DEGREES), rng.choice(steps) * rng.choice((1.0, 1.0, 1.001)))
            for _ in range(rng.randint(1, 40))]
    if rng.random() < 0.7:  # the table's order: by step time, then position
        rows.sort(key=lambda r: r.step_time_s)
    gpus = [64 if rng.random() < 0.9 else 128 for _ in rows]
    constraints = tuple(_constraint(rng) for _ in range(rng.choice((0, 0, 1, 2))))
    job = Job(seq_len=4096, global_batch_size=64, constraints=constraints)
    return rows, job, gpus, rng.choice((1, 3, 5, 8)), rng.choice((None, 8, 4))


@pytest.mark.parametrize("chunk", range(4))
def test_scan_matches_the_cp_sat_model(chunk: int) -> None:
    statuses = set()
    for seed in range(chunk * 100, chunk * 100 + 100):
        rows, job, gpus, k, max_tp = _table(seed)
        expected = cpsat_select(rows, job, gpus, k, max_tp)
        got = select_top(rows, job, gpus, k=k, max_tp=max_tp)
        assert (got.picks, got.status, got.solves) == expected, seed
        statuses.add(got.status)
    assert statuses == {"OPTIMAL", "INFEASIBLE"}  # both outcomes were exercised


def test_no_rows_or_no_picks_asked() -> None:
    rows, job, gpus, _, _ = _table(1)
    assert select_top([], job, [], k=5, max_tp=None).status == "EMPTY"
    assert select_top(rows, job, gpus, k=0, max_tp=None).picks == []


def test_a_regular_cluster_search_loads_no_solver_library() -> None:
    """ortools (and the pandas it imports) cost ~0.65 s; only a CP-SAT model needs them."""
    code = ("import sys\n"
            "from placer.solver import recommend\n"
            "from placer.spec import Job\n"
            "from placer.spec.presets import cluster_preset, model_preset\n"
            "recommend(model_preset('llama3-8b'), cluster_preset('dgx-h100').with_nodes(2),\n"
            "          Job(seq_len=4096, global_batch_size=64), top_k=3)\n"
            "print(sorted(m for m in ('ortools', 'pandas') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
