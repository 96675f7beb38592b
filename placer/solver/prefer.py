"""Rank a pick the cost model cannot back behind a validated one it does not clearly beat.

A candidate relying on a mechanism no measured run covers (``placer.cost.validity``, e.g. CP=4 at
8K tokens) is ranked as if it were slower by the model's measured error: it comes first only if
it beats the best validated layout by more than the model can resolve. The validated layouts come
from a second search restricted to them, run only when the first pick is unvalidated.

The picks are ranked before their rank maps are written (``Ranked``: a layout, its step time and
mesh order), so the second search's picks that do not make the cut cost no rank map.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from placer.cost.validity import MODEL_ERROR, unvalidated_mechanisms, validated_cp_limit
from placer.errors import InfeasibleError
from placer.spec.job import DegreeConstraint, Job
from placer.spec.layout import Layout
from placer.spec.results import Candidate


class Ranked(Protocol):
    """What the ranking reads of a pick (a Candidate, or the solver's pick before its rank map)."""

    @property
    def layout(self) -> Layout: ...

    @property
    def step_time_s(self) -> float: ...

    @property
    def mesh_order(self) -> Sequence[str]: ...


R = TypeVar("R", bound=Ranked)


def ranked_time_s(pick: Ranked, job: Job) -> float:
    """The step time a pick is ranked by: an unvalidated mechanism counts as the model's
    measured error slower."""
    penalty = MODEL_ERROR if unvalidated_mechanisms(pick.layout, job) else 0.0
    return pick.step_time_s * (1.0 + penalty)


def noted(candidate: Candidate, job: Job) -> Candidate:
    """The candidate with a why line saying what it relies on that nothing measured covers."""
    found = unvalidated_mechanisms(candidate.layout, job)
    if not found:
        return candidate
    line = (f"unvalidated: relies on {'; '.join(found)}, which no measured run covers; ranked "
            f"as if {MODEL_ERROR:.0%} slower (the model's measured error), so it leads only if "
            "it beats every validated layout by more than that")
    return candidate.model_copy(update={"why": [*candidate.why, line]})


def prefer_validated(picks: Sequence[R], job: Job, search: Callable[[Job], Sequence[R]],
                     top_k: int) -> tuple[list[R], bool]:
    """``picks`` (best first) re-ranked against the best validated layouts when the first is
    not (else unvalidated picks behind it ordered by their penalised time), and whether the
    result's candidates should carry the ``noted`` line (only when some pick is unvalidated).

    ``search(job)`` returns the best picks of the job restricted to validated CP degrees; it
    cannot lead with an unvalidated pick itself, so it is not re-ranked again.
    """
    if not picks:
        return [], False
    if not unvalidated_mechanisms(picks[0].layout, job):
        if not any(unvalidated_mechanisms(p.layout, job) for p in picks):
            return list(picks), False
        # A validated lead stays first; an unvalidated pick behind it is ranked by the same
        # penalised time as when it leads (stable sort: equal times keep the table's order).
        return sorted(picks, key=lambda p: ranked_time_s(p, job)), True
    limit = validated_cp_limit(job)
    rule = DegreeConstraint(key="cp", op="<=", values=(limit,))
    try:
        validated = search(job.model_copy(update={"constraints": (*job.constraints, rule)}))
    except InfeasibleError:
        return list(picks), True
    pool: dict[tuple[str, tuple[str, ...]], R] = {}
    for pick in [*picks, *validated]:
        pool.setdefault((pick.layout.compact(), tuple(pick.mesh_order)), pick)
    order = sorted(pool.values(), key=lambda p: (ranked_time_s(p, job), p.layout.compact()))
    return order[:top_k], True
