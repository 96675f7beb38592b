"""examples/ci: the GitHub workflow's check step and the pre-commit hook, run as written."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers_check import DATA, ROOT

CI = ROOT / "examples" / "ci"
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CHANGED_CONFIGS"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def _check_step() -> str:
    workflow = yaml.safe_load((CI / "placer-check.yml").read_text())
    steps = workflow["jobs"]["placer-check"]["steps"]
    return next(s["run"] for s in steps if s.get("name") == "placer check")


def _run_step(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", _check_step()], cwd=ROOT, env=_env(**env),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_workflow_check_runs_clean_on_the_projects_examples() -> None:
    result = _run_step()
    assert result.returncode == 0, result.stdout + result.stderr
    checked = sorted(str(p.relative_to(ROOT)) for p in
                     [*CI.glob("configs/*.sh"), *CI.glob("configs/*.toml"),
                      *ROOT.glob("examples/*/plan.json")])
    assert checked and f"in {len(checked)} file(s)" in result.stdout
    assert "::error" not in result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_workflow_check_fails_a_changed_bad_config(tmp_path: Path) -> None:
    changed = tmp_path / "changed.txt"
    bad = DATA / "megatron_llama3_8b_tp16.sh"
    changed.write_text(f"{DATA / 'megatron_llama3_8b_tp8.sh'}\n{bad}\n")
    result = _run_step(CHANGED_CONFIGS=str(changed))
    assert result.returncode == 1
    assert re.search(rf"^::error file={re.escape(str(bad))},line=\d+,title=tp-cross-node::",
                     result.stdout, re.M)


def test_workflow_triggers_on_the_paths_the_step_checks() -> None:
    workflow = yaml.safe_load((CI / "placer-check.yml").read_text())
    paths = workflow[True]["pull_request"]["paths"]  # YAML 1.1 reads the key "on" as True
    assert "examples/*/plan.json" in paths and "examples/ci/configs/**" in paths
    assert "examples/*/plan.json" in _check_step()


def _hook() -> dict[str, object]:
    hooks = yaml.safe_load((CI / ".pre-commit-hooks.yaml").read_text())
    assert [h["id"] for h in hooks] == ["placer-check"]
    return hooks[0]


def _run_hook(files: list[Path]) -> subprocess.CompletedProcess[str]:
    hook = _hook()
    pattern, exclude = re.compile(str(hook["files"])), re.compile(str(hook["exclude"]))
    staged = [str(f.relative_to(ROOT)) for f in files]
    matched = [f for f in staged if pattern.search(f) and not exclude.search(f)]
    assert matched == staged, "the hook must select these files"
    command = [*shlex.split(str(hook["entry"])), *hook["args"], *matched]  # type: ignore[misc]
    return subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)


def test_pre_commit_hook_passes_good_configs_and_blocks_bad_ones() -> None:
    good = _run_hook([*sorted(CI.glob("configs/*")), DATA / "plan_llama3_8b.json"])
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _run_hook([DATA / "torchtitan_llama3_8b_tp16.toml",
                     DATA / "megatron_llama3_8b_tp16.sh"])
    assert bad.returncode == 1 and "tp-cross-node" in bad.stdout


def test_pre_commit_hook_skips_pyproject() -> None:
    hook = _hook()
    assert re.search(str(hook["exclude"]), "pyproject.toml")
    assert re.search(str(hook["files"]), "train/torchtitan/llama3_8b.toml")
