"""Write plan.json: five layouts of model.yaml on cluster.yaml, costed by placer's cost model.

Run from the repository root:  .venv/bin/python examples/emulated-2x2/make_plan.py

The layouts and mesh orders are chosen by hand to contrast where TP runs; every number in the
plan comes from ``placer.cost.estimate`` with profile.yaml (what ``placer calibrate`` measured on
the emulated cluster). ``tests/test_verify_example.py`` checks that plan.json is what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHOICES = [
    ("tp=2,dp=2,mbs=64", "tp-dp", "TP inside a node, DP across nodes"),
    ("tp=2,dp=2,mbs=64", "dp-tp", "TP across nodes, DP inside a node"),
    ("tp=1,dp=4,mbs=32", "dp", "data parallel only"),
    ("tp=2,pp=2,mbs=64", "tp-pp", "TP inside a node, one pipeline stage per node"),
    ("tp=4,dp=1,mbs=64", "tp", "TP over all four ranks"),
]


def make_plan_text() -> str:
    from placer.report.plan import plan_json
    from placer.spec.presets import load_cluster, load_job, load_model
    from placer.spec.profile import load_link_profile
    from placer.verify.plans import plan_for_layouts

    plan = plan_for_layouts(load_model(str(HERE / "model.yaml")),
                            load_cluster(str(HERE / "cluster.yaml")),
                            load_job(HERE / "job.yaml"), CHOICES,
                            load_link_profile(HERE / "profile.yaml"))
    return plan_json(plan)


if __name__ == "__main__":
    (HERE / "plan.json").write_text(make_plan_text(), encoding="utf-8")
    print(f"wrote {HERE / 'plan.json'}", file=sys.stderr)
