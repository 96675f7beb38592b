"""examples/emulated-2x2 stays consistent: its cluster file and plan are what the code makes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from placer.cli.launch_command import load_plan
from placer.spec.presets import load_cluster
from placer.verify.cpu_cluster import emulated_cluster

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "emulated-2x2"


def test_cluster_file_describes_the_emulated_cluster() -> None:
    assert load_cluster(str(EXAMPLE / "cluster.yaml")) == emulated_cluster(2, 2, 400)


def test_plan_is_what_make_plan_writes() -> None:
    spec = importlib.util.spec_from_file_location("make_plan", EXAMPLE / "make_plan.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.make_plan_text() == (EXAMPLE / "plan.json").read_text(encoding="utf-8")
    plan = load_plan(EXAMPLE / "plan.json")
    orders = {(c.layout.tp, c.layout.dp, c.mesh_order[0]) for c in plan.candidates}
    assert (2, 2, "tp") in orders and (2, 2, "dp") in orders  # TP inside vs across nodes
