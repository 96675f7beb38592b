"""The solver: candidate space, costed table, the choice under constraints, rank -> GPU
placement, top K.

``recommend(model, cluster, job, top_k=5)`` returns a ``RecommendResult``: ranked ``Candidate``
objects (layout, placement as a rank map, cost breakdown) and ``SearchStats``; it raises
``InfeasibleError`` with the tightest reason when nothing fits.
"""

from placer.solver.search import (
    DEFAULT_TIME_LIMIT_S,
    RecommendResult,
    SearchDetail,
    paced_estimate,
    recommend,
    used_peaks_estimate,
)

__all__ = ["DEFAULT_TIME_LIMIT_S", "RecommendResult", "SearchDetail", "paced_estimate", "recommend",
           "used_peaks_estimate"]
