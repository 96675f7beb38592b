"""The plan: inputs echoed, ranked candidates, the why; built once, written byte-for-byte stable.

``make_plan`` runs the whole recommendation (search, the common default, the what-ifs, the
explanation). ``plan_json`` is the one serialisation every output uses (``--json``, ``--emit``,
the examples). Stability rules of the file (``placer schema plan`` documents its fields):

- keys sorted, two-space indent; a list or object that fits in 100 columns sits on one line, and
  so does each list item of up to 200 characters without nested lists (one rank-map entry,
  one line);
- no timestamps; ``search.wall_s`` is written as 0 because it varies run to run (the human output
  prints the search time on stderr instead), so the same inputs give byte-identical files;
- floats are written as Python's shortest round-trip repr.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from placer import __version__
from placer.report.baseline import Baseline, common_default
from placer.report.explain import explain
from placer.report.whatif import WhatIf, start_what_ifs
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.model import Model
from placer.spec.results import Candidate, Plan, SearchStats

LINE_WIDTH = 100
ITEM_WIDTH = 200


@dataclass(frozen=True)
class Recommendation:
    """The plan plus what the human output shows beside it (the common default's row)."""

    plan: Plan
    baseline: Baseline | None = None
    what_ifs: list[WhatIf] = field(default_factory=list)


def build_plan(model: Model, cluster: Cluster, job: Job, candidates: Sequence[Candidate], *,
               stats: SearchStats | None = None, defaults_used: Sequence[str] = (),
               explanation: Sequence[str] = ()) -> Plan:
    """Assemble a Plan; candidates stay in the solver's order (best first)."""
    return Plan(placer_version=__version__, model=model, cluster=cluster, job=job,
                num_gpus=cluster.num_gpus, defaults_used=list(defaults_used),
                candidates=list(candidates), explanation=list(explanation), search=stats)


def make_plan(model: Model, cluster: Cluster, job: Job, *, top_k: int = 5, profile: Any = None,
              defaults_used: Sequence[str] = (), with_what_ifs: bool = True,
              recommend_fn: Callable[..., Any] | None = None,
              estimate_fn: Callable[..., Any] | None = None,
              progress: Callable[[str], None] | None = None) -> Recommendation:
    """Search, compare with the common default, try the what-ifs, and explain the winner.

    ``progress`` hears what is being done (for a spinner). Raises ``InfeasibleError`` (from the
    solver) when no layout fits.
    """
    head, variants = plan_in_steps(model, cluster, job, top_k=top_k, profile=profile,
                                   defaults_used=defaults_used, with_what_ifs=with_what_ifs,
                                   recommend_fn=recommend_fn, estimate_fn=estimate_fn,
                                   progress=progress)
    return with_what_ifs_solved(head, list(variants))


def plan_in_steps(model: Model, cluster: Cluster, job: Job, *, top_k: int = 5,
                  profile: Any = None, defaults_used: Sequence[str] = (),
                  with_what_ifs: bool = True, recommend_fn: Callable[..., Any] | None = None,
                  estimate_fn: Callable[..., Any] | None = None,
                  progress: Callable[[str], None] | None = None, rank_maps: bool = True
                  ) -> tuple[Recommendation, Iterator[WhatIf]]:
    """``make_plan`` in two steps, so the answer can be shown before the what-ifs are solved:
    the recommendation without what-ifs, and the what-ifs, each solved when the iterator asks
    for it (``with_what_ifs_solved`` joins them). ``rank_maps=False`` leaves the candidates'
    rank maps empty, for a caller that prints only the tables (one entry per GPU and candidate:
    a fifth of the search at 16,384 GPUs)."""
    say = progress or (lambda _text: None)
    say(f"searching layouts for {model.name} on {cluster.num_gpus:,} GPUs")
    if recommend_fn is None:
        from placer.solver import recommend as recommend_fn
    if estimate_fn is None:
        from placer.cost import estimate as estimate_fn
    # The what-ifs start first, forked beside the main search where there are free cores;
    # the rest start when it ends, beside what follows (whatif.start_what_ifs).
    runs = (start_what_ifs(model, cluster, job, recommend_fn, top_k=top_k, profile=profile)
            if with_what_ifs else None)
    try:
        result = recommend_fn(model, cluster, job, top_k=top_k, profile=profile,
                              rank_maps=rank_maps)
    except BaseException:
        if runs is not None:
            runs.close()
        raise
    candidates: list[Candidate] = list(result.candidates)
    best = candidates[0]
    variants: Iterator[WhatIf] = runs.results() if runs is not None else iter(())
    say("estimating the common default")
    baseline = common_default(model, cluster, job, best.layout.num_gpus, _paced(estimate_fn),
                              profile)
    explanation = explain(model, cluster, job, candidates, baseline, [])
    plan = build_plan(model, cluster, job, candidates, stats=result.stats,
                      defaults_used=defaults_used, explanation=explanation)
    return Recommendation(plan, baseline), variants


def _paced(estimate_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``estimate_fn`` with an uneven split by GPU type priced in, as the search prices its
    picks (``placer.solver.paced_estimate``): on a mixed cluster the baseline's "vs base" then
    compares like with like."""
    from placer.solver import paced_estimate

    def paced(model: Model, cluster: Cluster, job: Job, layout: Any, **kwargs: Any) -> Any:
        return paced_estimate(model, cluster, job,
                              estimate_fn(model, cluster, job, layout, **kwargs))

    return paced


def with_what_ifs_solved(head: Recommendation, variants: list[WhatIf]) -> Recommendation:
    """The recommendation with the solved what-ifs in its explanation."""
    if not variants:
        return head
    plan = head.plan
    explanation = explain(plan.model, plan.cluster, plan.job, list(plan.candidates),
                          head.baseline, variants)
    return Recommendation(plan.model_copy(update={"explanation": explanation}), head.baseline,
                          variants)


def plan_data(plan: Plan) -> dict[str, Any]:
    """The plan as JSON data, with the run-to-run varying search time zeroed."""
    data = plan.model_dump(mode="json")
    if data.get("search") is not None:
        data["search"]["wall_s"] = 0.0
    return data


def plan_json(plan: Plan) -> str:
    """The stable text of a plan file (see the module docstring); ends with a newline."""
    return _format(plan_data(plan), 0) + "\n"


def _format(value: Any, indent: int, prefix: int = 0, item: bool = False) -> str:
    """JSON with sorted keys; a container that fits in the line width stays on one line.

    ``prefix`` is the width of what precedes the value on its line (``"key": ``); ``item`` says
    the value is a list element, which may take up to ``ITEM_WIDTH`` if it holds no list.
    """
    flat = json.dumps(value, sort_keys=True, separators=(", ", ": "), allow_nan=False)
    if not value or not isinstance(value, dict | list) or indent + prefix + len(flat) <= LINE_WIDTH:
        return flat
    if item and isinstance(value, dict) and len(flat) <= ITEM_WIDTH and "[" not in flat:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, list):
        items = [pad + _format(element, indent + 2, item=True) for element in value]
    else:
        items = []
        for key in sorted(value):
            head = f"{json.dumps(key)}: "
            items.append(pad + head + _format(value[key], indent + 2, len(head)))
    opening, closing = ("[", "]") if isinstance(value, list) else ("{", "}")
    return opening + "\n" + ",\n".join(items) + "\n" + " " * indent + closing
