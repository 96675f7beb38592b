"""Plans made of chosen layouts and mesh orders, costed by the cost model (for checks).

``recommend-layout`` keeps only what its search ranks best; a hardware check wants chosen
contrasts instead (TP inside a node against TP across nodes). Every number in such a plan comes
from ``estimate``; only the list of (layout, order) pairs is chosen by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

from placer.cost import estimate
from placer.mesh import order_text, parse_order
from placer.report.plan import build_plan
from placer.solver.placement import Placement, rank_map
from placer.spec import Candidate, Cluster, Job, Layout, Model, Plan, validate_layout
from placer.spec.profile import LinkProfile
from placer.topology import topology_of


def plan_for_layouts(model: Model, cluster: Cluster, job: Job,
                     choices: Sequence[tuple[str, str, str]],
                     profile: LinkProfile | None = None) -> Plan:
    """A plan whose candidates are ``(layout text, mesh order, why)``, best predicted first.

    Placements are the identity under each mesh order (torchrun rank = logical index), so the
    order alone decides which dimension stays inside a node.
    """
    topo = topology_of(cluster)
    candidates = []
    for text, order_spec, why in choices:
        layout = Layout.parse(text, cluster.num_gpus)
        validate_layout(layout, model, job, cluster.num_gpus)
        order = parse_order(order_spec)
        est = estimate(model, cluster, job, layout, order, None, profile)
        entries = rank_map(layout, Placement(order, None, "mesh order", ""), topo)
        candidates.append(Candidate.model_validate({
            **est.model_dump(), "rank_map": [e.model_dump() for e in entries],
            "why": [why, f"mesh order {order_text(order)}"]}))
    candidates.sort(key=lambda c: (c.step_time_s, c.layout.compact(), c.mesh_order))
    return build_plan(model, cluster, job, candidates)
