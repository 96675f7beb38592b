"""CP-SAT settings shared by every model of the solver."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ortools (with numpy and pandas) loads only when a model is solved: ~0.65 s
    from ortools.sat.python import cp_model

WALL_SAFETY_FACTOR = 20.0
WALL_SAFETY_S = 30.0
"""Wall-clock net behind the deterministic limit: a deterministic second is roughly a second of
one core, so 20x plus 30 s only trips when something is wrong, never by load."""


def deterministic_solver(time_limit_s: float) -> cp_model.CpSolver:
    """One worker, a fixed seed and a *deterministic* time limit: the same model gives the same
    answer even when the limit is hit (a wall-clock limit would stop at a load-dependent point).
    The wall-clock limit is only a safety net, far enough out that on a loaded machine the
    deterministic one still binds first."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = time_limit_s
    solver.parameters.max_time_in_seconds = WALL_SAFETY_FACTOR * time_limit_s + WALL_SAFETY_S
    return solver
