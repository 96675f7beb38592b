"""Same input, same bytes: across runs and across PYTHONHASHSEED values.

``placer recommend-layout`` (its report, plan.json and launch files), ``placer launch`` and
``placer check`` run as fresh processes under two hash seeds (string hashing, and so set order,
differs between them); every output byte must agree, and the plan must pass ``placer check``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PLACER = [sys.executable, "-m", "placer"]
ROOT = Path(__file__).resolve().parents[1]
SEEDS = ("0", "12345")
CASES = {
    "dense-1-node": ["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
                     "--seq-len", "4096", "--global-batch", "64"],
    "moe-2-nodes": ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "2",
                    "--seq-len", "4096", "--global-batch", "128", "--top", "2"],
    "mixed-nodes": ["--model", "llama3-8b", "--cluster",
                    str(ROOT / "examples" / "mixed-a100-h100" / "cluster.yaml"),
                    "--seq-len", "4096", "--global-batch", "64", "--top", "2"],
}


def _run(args: list[str], seed: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONHASHSEED": seed, "COLUMNS": "100", "TERM": "dumb"}
    return subprocess.run([*PLACER, *args], env=env, cwd=cwd, capture_output=True, timeout=300,
                          check=False)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_are_byte_identical_across_hash_seeds(case: str, tmp_path: Path) -> None:
    """recommend-layout prints its report and writes plan.json and the launch files (--emit);
    placer launch writes them again from plan.json; placer check passes the plan."""
    outputs: dict[str, dict[str, bytes]] = {}
    for seed in SEEDS:
        work = tmp_path / f"seed{seed}"
        work.mkdir()
        report = _run(["recommend-layout", *CASES[case], "--emit", "emit"], seed, work)
        assert report.returncode == 0, report.stderr.decode()
        launch = _run(["launch", "emit/plan.json", "--out", "launch"], seed, work)
        assert launch.returncode == 0, launch.stderr.decode()
        check = _run(["check", "emit/plan.json", "--format", "json"], seed, work)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
        outputs[seed] = {"report": report.stdout, "launch stdout": launch.stdout,
                         "check --format json": check.stdout,
                         **{f"emit/{k}": v for k, v in _files(work / "emit").items()},
                         **{f"launch/{k}": v for k, v in _files(work / "launch").items()}}
    first, second = (outputs[s] for s in SEEDS)
    assert sorted(first) == sorted(second)
    assert first["emit/plan.json"].startswith(b"{") and len(first) > 20
    for name in first:
        assert first[name] == second[name], f"{name} differs between PYTHONHASHSEED values"
    emitted = {k.removeprefix("emit/"): v for k, v in first.items() if k.startswith("emit/")}
    relaunched = {k.removeprefix("launch/"): v for k, v in first.items()
                  if k.startswith("launch/")}
    assert {k: v for k, v in emitted.items() if k != "plan.json"} == relaunched
