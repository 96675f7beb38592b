"""placer's #1 for every published recipe launches: the frameworks' own validators accept its files.

bench/recipes.py computes each recipe's #1 (``evaluate``: the recipe's job as placer plans it,
placer's search) and writes its plan.json (``--emit``). Here that same function runs once for
the module over every recipe in placer/spec/presets/recipes; ``placer launch``'s files are
written for each #1, and the framework acceptance checks of tests/test_launch_accept_*.py run on
them, one worker process per framework over all #1s: megatron-core 0.16.1 (TransformerConfig,
DistributedDataParallelConfig, RankGenerator against rankmap.json) with Megatron-Bridge 0.3.1's
field names, Megatron-Bridge 0.3.1's own YAML merge and runtime setup (tests/frameworks/
bridge_apply.py), torchtitan 0.3.0 (ConfigManager, ParallelDims, its own pipeline split) and 0.2.x
(TOML), DeepSpeed 0.19.8 (DeepSpeedConfig with and without an mpu) and the Kubeflow Training
SDK's PyTorchJob. The recipe stack's own launch dialect must have written its file for #1.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers_frameworks import Case, frameworks_python, missing, write_cases
from test_launch_accept_deepspeed import (
    test_deepspeed_config_with_and_without_mpu as deepspeed_accepts,
)
from test_launch_accept_kubeflow import (
    test_configmap_commands_run_and_fit as configmap_fits,
)
from test_launch_accept_kubeflow import (
    test_kubeflow_sdk_reads_every_pytorchjob as kubeflow_accepts,
)
from test_launch_accept_megatron import bridge_applies
from test_launch_accept_megatron import (
    test_megatron_core_accepts_the_flags_and_builds_the_plans_groups as megatron_accepts,
)
from test_launch_accept_torchtitan import test_torchtitan_02_toml as torchtitan_02_accepts
from test_launch_accept_torchtitan import test_torchtitan_03_python_config as torchtitan_accepts

from placer.spec.recipe import published_recipes

# The searches of every recipe (about 2-3 minutes on two cores), then the frameworks.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _bench_recipes() -> ModuleType:
    """bench/recipes.py itself (it imports its neighbour bench/accuracy.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    return importlib.import_module("recipes")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    """Every recipe's outcome (bench/recipes.py's evaluate, its default --top) and the folder
    holding each #1's plan.json."""
    if frameworks_python() is None:
        missing("no frameworks venv (.ci/run creates .venv-frameworks)")
    bench = _bench_recipes()
    emit = tmp_path_factory.mktemp("recipe-plans")
    recipes = published_recipes()
    # The searches are independent: one process per core (forked, so bench/ is importable).
    with ProcessPoolExecutor(max(1, min(len(os.sched_getaffinity(0)), 4)),
                             mp_context=multiprocessing.get_context("fork")) as pool:
        found = list(pool.map(bench.evaluate, recipes, [10] * len(recipes),
                              [emit] * len(recipes)))
    return emit, found


@pytest.fixture(scope="module")
def cases(outcomes: tuple[Path, list[Any]],
          tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    emit, found = outcomes
    plans = sorted(emit.glob("*/plan.json"))
    assert [p.parent.name for p in plans] == sorted(o.recipe.id for o in found)
    return write_cases(tmp_path_factory.mktemp("recipe-launch"), plans=plans)


def test_every_recipe_has_a_first_pick_its_stack_can_launch(
        outcomes: tuple[Path, list[Any]]) -> None:
    _, found = outcomes
    assert len(found) == len(published_recipes()) >= 15
    for outcome in found:
        assert outcome.best is not None, f"{outcome.recipe.id}: no #1 ({outcome.rank})"
        assert outcome.refusals == (), f"{outcome.recipe.id}: {outcome.refusals}"


def test_every_first_pick_keeps_the_issue16_rules(outcomes: tuple[Path, list[Any]]) -> None:
    """On the real recipes: no #1 with CP > 2 at <= 8K within the model's error, none inside the
    default headroom or outside its stack's rules, none > 10 % faster without a mechanism note
    (bench/recipes.py Outcome.checks; whether the recipe itself fits is the memory model's)."""
    _, found = outcomes
    broken = {o.recipe.id: [c for c in o.checks if c.startswith("#1")] for o in found}
    assert {k: v for k, v in broken.items() if v} == {}


def test_megatron_core_and_bridge_accept_every_first_pick(cases: list[Case],
                                                          tmp_path: Path) -> None:
    written = [c for c in cases if "megatron_args.sh" in c.written]
    for case in cases:  # e.g. torchtitan's op-level recompute, which Megatron has no flag for
        if "megatron_args.sh" not in case.written:
            assert any(line.startswith("megatron_args.sh not written: ")
                       for line in case.refused), case.id
    megatron_accepts(written, tmp_path)  # the megatron-core recipes' #1s are all among them


def test_megatron_bridge_runs_every_first_picks_overrides(cases: list[Case],
                                                         tmp_path: Path) -> None:
    """Bridge 0.3.1's own merge and setup, on recipes with and without a comm_overlap."""
    bridge_applies(cases, tmp_path)


def test_torchtitan_03_accepts_every_first_pick(cases: list[Case], tmp_path: Path) -> None:
    torchtitan_accepts(cases, tmp_path)


def test_torchtitan_02_accepts_every_first_pick(cases: list[Case], tmp_path: Path) -> None:
    torchtitan_02_accepts(cases, tmp_path)


def test_deepspeed_accepts_every_first_pick(cases: list[Case], tmp_path: Path) -> None:
    deepspeed_accepts(cases, tmp_path)


def test_kubeflow_reads_every_first_picks_pytorchjob(cases: list[Case], tmp_path: Path) -> None:
    kubeflow_accepts(cases, tmp_path)
    configmap_fits(cases, tmp_path)
