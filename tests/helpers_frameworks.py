"""Run placer's framework files through the real frameworks, installed in their own venv.

The frameworks (torchtitan, DeepSpeed, megatron-core, the Kubeflow SDK) pin packages placer's
own venv must not change, so ``.ci/run`` installs them in ``.venv-frameworks`` (torchtitan
0.2.x, whose configs are TOML, in ``.venv-frameworks/torchtitan-0.2`` on ``PYTHONPATH``), and
the tests call scripts in ``tests/frameworks/`` with that Python. ``PLACER_FRAMEWORKS_PYTHON``
and ``PLACER_TORCHTITAN_TOML_PATH`` point elsewhere. Tests skip, with the reason, when a
package is missing.

The cases are every candidate of every example plan (``examples/*/plan.json``: the seven
worked examples, whose commands include recommend-layout on the README's three models, and the
emulated 2x2 one).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from placer.cli.launch_command import load_plan
from placer.launch import launch_bundle
from placer.spec import Plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLANS = sorted(ROOT.glob("examples/*/plan.json"))
VENV = ROOT / ".venv-frameworks"
WORKERS = Path(__file__).parent / "frameworks"


def frameworks_python() -> Path | None:
    env = os.environ.get("PLACER_FRAMEWORKS_PYTHON")
    path = Path(env) if env else VENV / "bin" / "python"
    return path if path.exists() else None


def megatron_bridge_src() -> Path | None:
    """The unpacked megatron-bridge wheel (source only: it needs CUDA's transformer_engine)."""
    env = os.environ.get("PLACER_MEGATRON_BRIDGE_SRC")
    path = Path(env) if env else VENV / "megatron-bridge"
    return path if (path / "megatron" / "bridge").is_dir() else None


def torchtitan_toml_path() -> Path | None:
    env = os.environ.get("PLACER_TORCHTITAN_TOML_PATH")
    path = Path(env) if env else VENV / "torchtitan-0.2"
    return path if (path / "torchtitan").is_dir() else None


@cache
def installed(module: str, pythonpath: str = "") -> str | None:
    """The version of ``module``'s distribution in the frameworks venv, or None."""
    python = frameworks_python()
    if python is None:
        return None
    code = ("import importlib.metadata as m, sys\n"
            "try:\n    print(m.version(sys.argv[1]))\nexcept m.PackageNotFoundError:\n"
            "    sys.exit(1)")
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    done = subprocess.run([str(python), "-c", code, module], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    return done.stdout.strip() if done.returncode == 0 else None


def missing(why: str) -> None:
    """Skip a test whose framework package is missing; under CI=true fail instead (.ci/run
    installs every package, so a skip there would be a silent pass)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"framework acceptance under CI=true: {why}")
    pytest.skip(why)


def need(package: str, pythonpath: str = "") -> str:
    """Skip unless ``package`` is installed in the frameworks venv; return its version."""
    if frameworks_python() is None:
        missing(f"no frameworks venv ({VENV}; .ci/run creates it, or set "
                "PLACER_FRAMEWORKS_PYTHON)")
    version = installed(package, pythonpath)
    if version is None:
        missing(f"{package} is not installed in the frameworks venv (.ci/run installs it)")
    return version


@dataclass(frozen=True)
class Case:
    """One candidate of one example plan, its launch files written under ``folder``."""

    id: str
    plan: Plan
    index: int
    folder: Path
    written: tuple[str, ...]
    refused: tuple[str, ...]

    @property
    def layout(self) -> Any:
        return self.plan.candidates[self.index].layout

    @property
    def stage_layers(self) -> list[int]:
        stages = self.plan.candidates[self.index].stage_layers
        layout, layers = self.layout, self.plan.model.num_layers
        return list(stages) if stages else [layers // layout.pp] * layout.pp


def write_case(folder: Path, case_id: str, plan: Plan, index: int = 0,
               framework_versions: tuple[str, ...] = ()) -> Case:
    """Candidate ``index``'s launch files, written into the new ``folder``."""
    folder.mkdir(parents=True)
    files, refused = launch_bundle(plan, index, framework_versions=framework_versions)
    for f in files:
        (folder / f.name).write_text(f.text)
    return Case(case_id, plan, index, folder, tuple(f.name for f in files),
                tuple(r.line() for r in refused))


def write_cases(root: Path, framework_versions: tuple[str, ...] = (),
                plans: list[Path] | None = None) -> list[Case]:
    """Every candidate's launch files, one folder each: of the example plans, or of ``plans``
    (each named by its folder, as bench/recipes.py --emit writes them)."""
    cases = []
    for plan_path in EXAMPLE_PLANS if plans is None else plans:
        plan = load_plan(plan_path)
        for index in range(len(plan.candidates)):
            case_id = f"{plan_path.parent.name}#{index}"
            cases.append(write_case(root / case_id.replace("#", "-"), case_id, plan, index,
                                    framework_versions))
    return cases


@cache
def example_cases() -> list[Case]:
    """``write_cases`` with the default versions, written once per test session."""
    root = Path(tempfile.mkdtemp(prefix="placer-frameworks-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return write_cases(root)


def run_worker(script: str, args: list[str], manifest: list[dict[str, Any]], tmp: Path,
               pythonpath: str = "", timeout_s: int = 900,
               env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Run ``tests/frameworks/<script>`` on the manifest; its JSON lines by case id."""
    python = frameworks_python()
    assert python is not None
    path = tmp / f"{script}.manifest.json"
    path.write_text(json.dumps(manifest))
    run_env = dict(os.environ, PYTHONPATH=pythonpath, CUDA_VISIBLE_DEVICES="",
                   DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore", **(env or {}))
    done = subprocess.run([str(python), str(WORKERS / script), *args, str(path)],
                          capture_output=True, text=True, timeout=timeout_s, check=False,
                          env=run_env, cwd=tmp)
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {r["id"]: r for r in results}
