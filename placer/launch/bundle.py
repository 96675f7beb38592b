"""The launch bundle of one candidate: every file rendered in memory, then written
all-or-nothing (``placer.launch`` re-exports these names)."""


from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from placer.dialects import Refusal, resolve_versions
from placer.errors import InputError
from placer.io import OutputFile, write_files
from placer.launch.env import render_env_sh
from placer.launch.frameworks import framework_files
from placer.launch.priced import StackPrice
from placer.launch.rankmap import PlacedCandidate, placement_of, rankmap_document
from placer.launch.readme import render_readme
from placer.launch.scripts import (
    DEFAULT_MASTER_PORT,
    DEFAULT_SCRIPT,
    render_launch_sh,
    render_pytorchjob,
    render_sbatch,
)
from placer.launch.shell import checked
from placer.spec import Cluster, Plan

__all__ = [
    "DEFAULT_MASTER_PORT", "DEFAULT_SCRIPT", "LaunchBundle", "PlacedCandidate", "StackPrice",
    "launch_bundle", "render_bundle", "launch_files",
    "placement_of", "require_nccl_gpus", "write_files",
    "placer_mesh_source", "rankmap_document", "write_launch_files",
]


def require_nccl_gpus(cluster: Cluster) -> None:
    """Refuse clusters of AMD GPUs: the launch files set CUDA and NCCL variables and number GPUs
    as nvidia-smi does; placer does not know ROCm's equivalents well enough to write them."""
    amd = sorted({t.gpu.name for t in cluster.node_types if t.gpu.collectives_library != "nccl"})
    if amd:
        raise InputError(f"cluster {cluster.name} gpu", amd[0],
                         "placer writes launch files for NVIDIA GPUs (NCCL/CUDA) only; an AMD "
                         "GPU (RCCL/ROCm) needs its own launcher: use the plan's layout and "
                         "rankmap without --emit/launch")


def placer_mesh_source() -> str:
    """The self-contained runtime module users copy next to their training script."""
    return resources.files("placer.launch").joinpath("templates", "placer_mesh.py").read_text(
        encoding="utf-8")


@dataclass(frozen=True)
class LaunchBundle:
    """Every launch file of one candidate, the framework files left out (with why), and the
    written framework files priced on their own framework's stack (``priced``) where the plan
    was searched on another's."""

    files: list[OutputFile]
    refused: list[Refusal]
    prices: list[StackPrice]

    def warnings(self) -> list[str]:
        """One line per framework file whose layout does not fit its framework's stack."""
        return [price.warning() for price in self.prices if price.fits is False]


def render_bundle(plan: Plan, candidate_index: int = 0, *, script: str = DEFAULT_SCRIPT,
           master_port: int = DEFAULT_MASTER_PORT, debug: bool = False,
           framework_versions: tuple[str, ...] = ()) -> LaunchBundle:
    """Render every launch file in memory (validation errors surface before anything is written).

    ``framework_versions`` are ``TARGET=VERSION`` choices (defaults: each dialect's
    ``TARGET.default``). A framework file the chosen version rejects is left out and returned
    as a Refusal; when the user named that target's version, it is an InputError instead.
    Same plan and options -> the same bytes: no timestamps, no absolute paths.
    """
    if not 1 <= master_port <= 65535:
        raise InputError("--master-port", master_port, "use a TCP port 1..65535")
    checked(script, "script", "--script")
    require_nccl_gpus(plan.cluster)
    versions = resolve_versions(framework_versions)
    placement = placement_of(plan, candidate_index)
    frameworks, refused, prices = framework_files(placement, versions)
    named = {pair.partition("=")[0].strip().lower() for pair in framework_versions}
    for refusal in refused:
        name = refusal.target.name
        if name in named:
            raise InputError("--framework-version", f"{name}={versions[name]}", refusal.line())
    rankmap = json.dumps(rankmap_document(placement), indent=1) + "\n"
    return LaunchBundle([
        OutputFile("rankmap.json", rankmap),
        OutputFile("placer_mesh.py", placer_mesh_source()),
        OutputFile("env.sh", render_env_sh(placement, debug=debug)),
        OutputFile("launch.sh", render_launch_sh(placement, script, master_port), 0o755),
        OutputFile("job.sbatch", render_sbatch(placement), 0o755),
        OutputFile("pytorchjob.yaml", render_pytorchjob(placement, master_port)),
        *frameworks,
        OutputFile("README.md", render_readme(placement, script, debug, versions,
                                              [f.name for f in frameworks], refused, prices)),
    ], refused, prices)


def launch_bundle(plan: Plan, candidate_index: int = 0, *, script: str = DEFAULT_SCRIPT,
                  master_port: int = DEFAULT_MASTER_PORT, debug: bool = False,
                  framework_versions: tuple[str, ...] = ()
                  ) -> tuple[list[OutputFile], list[Refusal]]:
    """The files and refusals of ``render_bundle``."""
    made = render_bundle(plan, candidate_index, script=script, master_port=master_port,
                         debug=debug, framework_versions=framework_versions)
    return made.files, made.refused


def launch_files(plan: Plan, candidate_index: int = 0, *, script: str = DEFAULT_SCRIPT,
                 master_port: int = DEFAULT_MASTER_PORT, debug: bool = False,
                 framework_versions: tuple[str, ...] = ()) -> list[OutputFile]:
    """The files of ``launch_bundle`` (refused framework files are named in the README)."""
    return launch_bundle(plan, candidate_index, script=script, master_port=master_port,
                         debug=debug, framework_versions=framework_versions)[0]


def write_launch_files(plan: Plan, candidate_index: int, out_dir: Path, *,
                       script: str = DEFAULT_SCRIPT, master_port: int = DEFAULT_MASTER_PORT,
                       debug: bool = False, force: bool = False,
                       framework_versions: tuple[str, ...] = ()) -> list[Path]:
    """Render and write the launch files of candidate ``candidate_index`` into ``out_dir``.

    Raises PlacerError (and writes nothing) on an invalid plan or option, or when a file exists
    and ``force`` is false. Returns the written paths.
    """
    files = launch_files(plan, candidate_index, script=script, master_port=master_port,
                         debug=debug, framework_versions=framework_versions)
    return write_files(Path(out_dir), files, force=force)
