"""Rank a pick the cost model cannot back behind a validated one it does not clearly beat.

A candidate relying on a mechanism no measured run covers (``placer.cost.validity``, e.g. CP=4 at
8K tokens) is ranked as if it were slower by the model's measured error: it comes first only if
it beats the best validated layout by more than the model can resolve. The validated layouts come
from a second search restricted to them, run only when the first pick is unvalidated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from placer.cost.validity import MODEL_ERROR, unvalidated_mechanisms, validated_cp_limit
from placer.errors import InfeasibleError
from placer.spec.job import DegreeConstraint, Job
from placer.spec.results import Candidate

if TYPE_CHECKING:
    from placer.solver.search import RecommendResult


def _ranked_time_s(candidate: Candidate, job: Job) -> float:
    penalty = MODEL_ERROR if unvalidated_mechanisms(candidate.layout, job) else 0.0
    return candidate.step_time_s * (1.0 + penalty)


def _noted(candidate: Candidate, job: Job) -> Candidate:
    found = unvalidated_mechanisms(candidate.layout, job)
    if not found:
        return candidate
    line = (f"unvalidated: relies on {'; '.join(found)}, which no measured run covers; ranked "
            f"as if {MODEL_ERROR:.0%} slower (the model's measured error), so it leads only if "
            "it beats every validated layout by more than that")
    return candidate.model_copy(update={"why": [*candidate.why, line]})


def prefer_validated(result: RecommendResult, job: Job,
                     search: Callable[[Job], RecommendResult], top_k: int) -> RecommendResult:
    """``result`` re-ranked against the best validated layouts when its first pick is not."""
    if not result.candidates or not unvalidated_mechanisms(result.candidates[0].layout, job):
        return result
    limit = validated_cp_limit(job)
    rule = DegreeConstraint(key="cp", op="<=", values=(limit,))
    try:
        validated = search(job.model_copy(update={"constraints": (*job.constraints, rule)}))
    except InfeasibleError:
        noted = [_noted(c, job) for c in result.candidates]
        return replace(result, candidates=noted)
    pool: dict[tuple[str, tuple[str, ...]], Candidate] = {}
    for candidate in [*result.candidates, *validated.candidates]:
        pool.setdefault((candidate.layout.compact(), tuple(candidate.mesh_order)), candidate)
    order = sorted(pool.values(), key=lambda c: (_ranked_time_s(c, job), c.layout.compact()))
    return replace(result, candidates=[_noted(c, job) for c in order[:top_k]])
