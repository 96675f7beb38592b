"""CP-SAT settings shared by every model of the solver."""

from __future__ import annotations

from ortools.sat.python import cp_model


def deterministic_solver(time_limit_s: float) -> cp_model.CpSolver:
    """One worker, a fixed seed and a *deterministic* time limit: the same model gives the same
    answer even when the limit is hit (a wall-clock limit would stop at a load-dependent point);
    the wall-clock limit is only a safety net at twice the budget."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = time_limit_s
    solver.parameters.max_time_in_seconds = 2 * time_limit_s
    return solver
