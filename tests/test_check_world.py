"""What the scheduler tells a launch script: ``#SBATCH`` headers, ``--nodes``/``--env``, placer's
own ``# placer-world:`` line, and real Slurm as the truth for the variables a header sets."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_slurm import SlurmCluster, slurm_cluster

from placer.check.parse_megatron import parse_megatron
from placer.check.world import (
    node_inputs,
    parse_env,
    placer_world,
    sbatch_inputs,
    sbatch_options,
)
from placer.errors import InputError

__all__ = ["slurm_cluster"]

HEADER = """#!/bin/bash
#SBATCH --job-name=x
# a comment between headers
#SBATCH -N 3 --ntasks-per-node=8   # trailing comment
#SBATCH --gres=gpu:h100:8
echo start
#SBATCH --nodes=99
"""


def test_sbatch_headers_before_the_first_command() -> None:
    options = sbatch_options(HEADER)
    assert options["nodes"] == ("3", 4) and options["ntasks-per-node"] == ("8", 4)
    env, notes = sbatch_inputs(options)
    assert env["SLURM_NNODES"] == env["SLURM_JOB_NUM_NODES"] == "3"
    assert env["SLURM_NTASKS"] == "24" and env["SLURM_GPUS_ON_NODE"] == "8"
    assert notes == ["line 4: #SBATCH --nodes=3"]
    ranged, notes = sbatch_inputs(sbatch_options("#SBATCH --nodes=2-4\n"))
    assert "SLURM_NNODES" not in ranged and "range" in notes[0]


def test_nodes_and_env_options_are_the_scheduler_variables() -> None:
    assert node_inputs(4)["SLURM_NNODES"] == "4" and node_inputs(4)["PET_NNODES"] == "4"
    assert parse_env(("A=1", "B=x=y", "A=2")) == {"A": "2", "B": "x=y"}
    with pytest.raises(InputError, match="--env"):
        parse_env(("1A=2",))


def test_slurm_default_is_not_a_fixed_one_node() -> None:
    script = ("NNODES=${SLURM_NNODES:-1}\ntorchrun --nnodes $NNODES --nproc-per-node 8 x.py "
              "--tensor-model-parallel-size 8\n")
    assert parse_megatron(Path("a.sh"), script).world_size is None
    assert parse_megatron(Path("a.sh"), script, node_inputs(4)).world_size == 32
    assert parse_megatron(Path("a.sh"), "#SBATCH --nodes=2\n" + script).world_size == 16


def test_placer_world_line() -> None:
    assert placer_world("x\n# placer-world: nodes=8 gpus_per_node=4\n") == (8, 4, 2)
    assert placer_world("# placer-world: nodes=0 gpus_per_node=4\n") is None


SLURM_SCRIPT = """#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:2
#SBATCH --output={out}/slurm-%j.out
env | grep -E '^SLURM_(NNODES|JOB_NUM_NODES|NTASKS|NPROCS|NTASKS_PER_NODE|GPUS_ON_NODE)=' \\
    > {out}/env.txt
"""


def test_header_variables_match_real_slurm(slurm_cluster: SlurmCluster,
                                           tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(SLURM_SCRIPT.format(out=tmp_path))
    record = slurm_cluster.wait_job(slurm_cluster.sbatch(script), timeout_s=60)
    assert record["JobState"] == "COMPLETED", slurm_cluster.log_tail()
    real = dict(line.split("=", 1) for line in (tmp_path / "env.txt").read_text().split())
    predicted, _ = sbatch_inputs(sbatch_options(script.read_text()))
    assert {k: v for k, v in predicted.items() if k in real} == real
    assert set(real) <= set(predicted) and len(real) >= 5, real
