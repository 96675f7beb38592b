"""The generated job.sbatch runs to COMPLETED on a real one-node Slurm (tests/helpers_slurm.py).

sbatch job.sbatch -> srun (one task per node) -> launch.sh -> torchrun -> 4 gloo ranks, each
importing the generated placer_mesh and all-gathering over every group. The expected groups come
from the plan's rank-map coordinates alone (ranks that agree on every other coordinate). The
fake GPUs of the fixture let --gpus-per-node allocate; PLACER_BACKEND=gloo runs on the CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_launch import JOB, candidate, plan, small_cluster
from helpers_slurm import SlurmCluster, slurm_cluster
from test_launch_emulated import CHECK_SCRIPT

from placer.launch import write_launch_files
from placer.mesh import DENSE_DIMS
from placer.spec import Layout
from placer.spec.presets import model_preset

__all__ = ["slurm_cluster"]  # the fixture, imported so pytest finds it here
pytestmark = pytest.mark.slow


def _expected(coords: list[dict[str, int]], dim: str) -> list[list[int]]:
    """Each rank's group along ``dim``: the ranks equal to it on every other dense dim."""
    others = [d for d in DENSE_DIMS if d != dim]
    return [sorted(r for r, c in enumerate(coords) if all(c[o] == mine[o] for o in others))
            for mine in coords]


def test_job_sbatch_completes_with_the_plans_groups(slurm_cluster: SlurmCluster,
                                                     tmp_path: Path) -> None:
    model = model_preset("llama3-8b")
    cluster = small_cluster(1, slurm_cluster.gpus)
    layout = Layout(tp=2, dp=slurm_cluster.gpus // 2, zero_stage=1, sequence_parallel=True)
    p = plan(model, cluster, [candidate(model, cluster, JOB, layout)])
    launch = tmp_path / "launch"
    write_launch_files(p, 0, launch, script="check.py")
    (launch / "check.py").write_text(CHECK_SCRIPT)
    results = tmp_path / "results"
    results.mkdir()
    env = dict(slurm_cluster.env, PYTHON=sys.executable, PLACER_BACKEND="gloo",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # Submitted from the launch directory, as its header says; Slurm passes this environment.
    done = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/job.out", "job.sbatch",
                           str(results)], env=env, cwd=launch, capture_output=True, text=True,
                          timeout=60, check=True)
    job_id = int(done.stdout.strip().split(";")[0])
    record = slurm_cluster.wait_job(job_id, timeout_s=240)
    log = (tmp_path / "job.out").read_text(errors="replace")
    assert record["JobState"] == "COMPLETED", f"{record}\n{log[-3000:]}"
    assert record["ExitCode"] == "0:0", log[-3000:]
    coords = [e.coords for e in p.candidates[0].rank_map]
    for rank in range(layout.num_gpus):
        got = json.loads((results / f"rank{rank}.json").read_text())
        assert got["backend"] == "gloo"
        for dim in ("tp", "dp"):
            assert sorted(got["groups"][dim]) == _expected(
                [{d: c[d] for d in DENSE_DIMS} for c in coords], dim)[rank], (rank, dim)
