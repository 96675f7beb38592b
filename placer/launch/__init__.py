"""Launch artifacts from a plan: rank map, placer_mesh runtime, NCCL env, torchrun/Slurm/Kubeflow
launchers and Megatron/torchtitan/DeepSpeed configs, written all-or-nothing.

``write_launch_files`` is the one entry point; ``placer launch`` and ``recommend-layout --emit``
both call it.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from placer.errors import InputError
from placer.launch.env import render_env_sh
from placer.launch.frameworks import (
    render_deepspeed_json,
    render_megatron_sh,
    render_torchtitan_toml,
)
from placer.launch.rankmap import Placement, placement_of, rankmap_document
from placer.launch.readme import render_readme
from placer.launch.scripts import (
    DEFAULT_MASTER_PORT,
    DEFAULT_SCRIPT,
    render_launch_sh,
    render_pytorchjob,
    render_sbatch,
)
from placer.launch.shell import checked
from placer.launch.writer import OutputFile, write_files
from placer.spec import Plan

__all__ = [
    "DEFAULT_MASTER_PORT", "DEFAULT_SCRIPT", "Placement", "launch_files", "placement_of",
    "placer_mesh_source", "rankmap_document", "write_launch_files",
]


def placer_mesh_source() -> str:
    """The self-contained runtime module users copy next to their training script."""
    return resources.files("placer.launch").joinpath("templates", "placer_mesh.py").read_text(
        encoding="utf-8")


def launch_files(plan: Plan, candidate_index: int = 0, *, script: str = DEFAULT_SCRIPT,
                 master_port: int = DEFAULT_MASTER_PORT, debug: bool = False) -> list[OutputFile]:
    """Render every launch file in memory (validation errors surface before anything is written).

    Same plan and options -> the same bytes: no timestamps, no absolute paths.
    """
    if not 1 <= master_port <= 65535:
        raise InputError("--master-port", master_port, "use a TCP port 1..65535")
    checked(script, "script", "--script")
    placement = placement_of(plan, candidate_index)
    rankmap = json.dumps(rankmap_document(placement), indent=1) + "\n"
    return [
        OutputFile("rankmap.json", rankmap),
        OutputFile("placer_mesh.py", placer_mesh_source()),
        OutputFile("env.sh", render_env_sh(placement, debug=debug)),
        OutputFile("launch.sh", render_launch_sh(placement, script, master_port), 0o755),
        OutputFile("job.sbatch", render_sbatch(placement), 0o755),
        OutputFile("pytorchjob.yaml", render_pytorchjob(placement, master_port)),
        OutputFile("megatron_args.sh", render_megatron_sh(placement)),
        OutputFile("torchtitan.toml", render_torchtitan_toml(placement)),
        OutputFile("deepspeed.json", render_deepspeed_json(placement)),
        OutputFile("README.md", render_readme(placement, script, debug)),
    ]


def write_launch_files(plan: Plan, candidate_index: int, out_dir: Path, *,
                       script: str = DEFAULT_SCRIPT, master_port: int = DEFAULT_MASTER_PORT,
                       debug: bool = False, force: bool = False) -> list[Path]:
    """Render and write the launch files of candidate ``candidate_index`` into ``out_dir``.

    Raises PlacerError (and writes nothing) on an invalid plan or option, or when a file exists
    and ``force`` is false. Returns the written paths.
    """
    files = launch_files(plan, candidate_index, script=script, master_port=master_port,
                         debug=debug)
    return write_files(Path(out_dir), files, force=force)
