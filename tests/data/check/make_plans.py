"""Regenerate the plan files of this folder:  .venv/bin/python tests/data/check/make_plans.py

Each candidate is what recommend-layout writes for it (the cost model's estimate, the solver's
rank map under a mesh order); some plans are then edited the way people edit plans by hand, as
the docstring of each says. ``placer check`` recomputes everything it reports, so the estimates
stored here do not need to stay current with the cost model.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from placer.cost import estimate
from placer.mesh import parse_order
from placer.report.plan import build_plan, plan_json
from placer.solver.placement import Placement, rank_map
from placer.spec import Candidate, Cluster, Job, Layout, Model, Plan
from placer.spec.presets import cluster_preset, model_preset
from placer.topology import topology_of

HERE = Path(__file__).resolve().parent


def candidate(model: Model, cluster: Cluster, job: Job, layout: str, order: str) -> Candidate:
    parsed = Layout.parse(layout)
    mesh_order = parse_order(order)
    est = estimate(model, cluster, job, parsed, mesh_order)
    ranks = rank_map(parsed, Placement(mesh_order, None, "order", ""), topology_of(cluster))
    return Candidate.model_validate({**est.model_dump(), "rank_map": [
        r.model_dump() for r in ranks], "why": [f"mesh order {order}"]})


def plan(model: str, nodes: int, job: Job, layouts: list[tuple[str, str]]) -> Plan:
    cluster = cluster_preset("dgx-h100").with_nodes(nodes)
    spec = model_preset(model)
    return build_plan(spec, cluster, job, [candidate(spec, cluster, job, layout, order)
                                           for layout, order in layouts])


def llama3_8b() -> Plan:
    """Llama-3-8B on 2 DGX H100: TP=8 inside each node (order tp-cp-dp-pp), and TP=4."""
    job = Job(seq_len=8192, global_batch_size=128)
    return plan("llama3-8b", 2, job, [
        ("tp=8,pp=1,dp=2,mbs=1,zero=1,recompute=selective,sp=on", "tp-cp-dp-pp"),
        ("tp=4,pp=1,dp=4,mbs=1,zero=1,recompute=full,sp=on", "tp-cp-dp-pp")])


def torchrun_mismatch() -> Plan:
    """llama3_8b's first candidate with the two nodes' rank blocks swapped by hand: ranks 0-7
    listed on node 1, which torchrun would number 8-15."""
    good = llama3_8b()
    first = good.candidates[0]
    swapped = [entry.model_copy(update={"node": 1 - entry.node}) for entry in first.rank_map]
    edited = first.model_copy(update={"rank_map": swapped})
    return good.model_copy(update={"candidates": [edited]})


def strided_tp() -> Plan:
    """Llama-3-8B with data parallelism innermost (order dp-tp-cp-pp): TP groups take every
    other rank and span both nodes."""
    job = Job(seq_len=8192, global_batch_size=128)
    return plan("llama3-8b", 2, job,
                [("tp=8,pp=1,dp=2,mbs=1,zero=1,recompute=selective,sp=on", "dp-tp-cp-pp")])


def llama3_70b_oom() -> Plan:
    """Llama-3-70B on 2 DGX H100 with TP=8, no ZeRO and no recompute: 70e9/8 parameters at 18
    bytes each (weights, fp32 gradients and Adam state) do not fit in 80 GB."""
    job = Job(seq_len=8192, global_batch_size=64)
    return plan("llama3-70b", 2, job,
                [("tp=8,pp=1,dp=2,mbs=1,zero=0,recompute=none,sp=on", "tp-cp-dp-pp")])


PLANS: dict[str, Callable[[], Plan]] = {
    "plan_llama3_8b.json": llama3_8b,
    "plan_torchrun_mismatch.json": torchrun_mismatch,
    "plan_strided_tp.json": strided_tp,
    "plan_llama3_70b_oom.json": llama3_70b_oom,
}


def main() -> None:
    for name, make in PLANS.items():
        (HERE / name).write_text(plan_json(make()), encoding="utf-8")


if __name__ == "__main__":
    main()
