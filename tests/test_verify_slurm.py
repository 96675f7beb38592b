"""``placer verify --slurm`` on a real one-node Slurm (tests/helpers_slurm.py)."""

from __future__ import annotations

from pathlib import Path

from helpers_slurm import SlurmCluster, slurm_cluster

__all__ = ["slurm_cluster"]


def test_fixture_allocates_fake_gpus_and_reports_exit(slurm_cluster: SlurmCluster,
                                                      tmp_path: Path) -> None:
    ok = tmp_path / "ok.sbatch"
    ok.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=2\n"
                  'srun --ntasks-per-node=1 bash -c \'echo "$SLURM_NODEID $CUDA_VISIBLE_DEVICES" '
                  '> out.txt\'\n')
    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\nexit 3\n")
    ok_id = slurm_cluster.sbatch(ok)
    bad_id = slurm_cluster.sbatch(bad)
    assert slurm_cluster.wait_job(ok_id)["JobState"] == "COMPLETED"
    record = slurm_cluster.wait_job(bad_id)
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "3:0")
    node_id, visible = (tmp_path / "out.txt").read_text().split()
    assert node_id == "0" and len(visible.split(",")) == 2
