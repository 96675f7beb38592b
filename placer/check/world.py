"""What the scheduler tells a launch script: run-time variables, ``#SBATCH`` headers, ``--nodes``.

A launch script reads its node count from the environment Slurm (or torchrun, Kubeflow's
PyTorchJob, MPI) sets when the job starts, so ``${SLURM_NNODES:-1}`` is not 1: it is unknown
until ``placer check --nodes N`` / ``--env K=V`` or the script's own ``#SBATCH`` header says.
Slurm sets SLURM_NNODES and SLURM_JOB_NUM_NODES from ``--nodes``/``-N``, SLURM_NTASKS_PER_NODE
from ``--ntasks-per-node``, SLURM_NTASKS from ``--ntasks`` (or nodes x tasks per node) and
SLURM_GPUS_ON_NODE / SLURM_GPUS_PER_NODE from ``--gres=gpu:N`` / ``--gpus-per-node`` (sbatch(1),
"OUTPUT ENVIRONMENT VARIABLES"); sbatch reads ``#SBATCH`` lines only before the first command.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from placer.errors import InputError

# Variables set when the job runs (Slurm, torchrun/torchelastic, PyTorchJob PET_*, Open MPI,
# PMI); unknown to a static reader unless given.
RUNTIME_VARIABLES = (
    "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID",
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST",
    "SLURM_CPUS_PER_TASK", "SLURM_ARRAY_TASK_ID", "SLURM_SUBMIT_DIR",
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "NNODES", "PET_NNODES", "PET_NPROC_PER_NODE",
    "PET_NODE_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
    "CUDA_VISIBLE_DEVICES", "HOSTNAME", "PWD", "HOME", "USER",
)
# What ``--nodes N`` sets: every variable a scheduler uses for the node count.
NODE_COUNT_VARIABLES = ("SLURM_NNODES", "SLURM_JOB_NUM_NODES", "NNODES", "NUM_NODES",
                        "PET_NNODES")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env(items: tuple[str, ...]) -> dict[str, str]:
    """``--env K=V`` options as a mapping (the last one of a name wins)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not _NAME_RE.match(name):
            raise InputError("--env", item, "write NAME=VALUE, e.g. --env SLURM_NNODES=4")
        out[name] = value
    return out


def sbatch_options(text: str) -> dict[str, tuple[str, int]]:
    """``#SBATCH`` options before the first command: long name -> (value, line)."""
    short = {"N": "nodes", "n": "ntasks", "G": "gpus", "c": "cpus-per-task"}
    options: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not stripped.startswith("#SBATCH")):
            continue
        if not stripped.startswith("#SBATCH"):
            break
        try:
            words = shlex.split(stripped[len("#SBATCH"):], comments=True)
        except ValueError:
            continue
        k = 0
        while k < len(words):
            word = words[k]
            if word.startswith("--"):
                name, eq, value = word[2:].partition("=")
                if not eq and k + 1 < len(words) and not words[k + 1].startswith("-"):
                    value, k = words[k + 1], k + 1
            elif word.startswith("-") and len(word) >= 2:
                name = short.get(word[1], word[1])
                value = word[2:]
                if not value and k + 1 < len(words) and not words[k + 1].startswith("-"):
                    value, k = words[k + 1], k + 1
            else:
                k += 1
                continue
            options[name] = (value.lstrip("="), number)
            k += 1
    return options


def _count(value: str) -> str | None:
    """A node or task count: ``4``, or ``2-4`` (sbatch gives the job at most the maximum; the
    count is only known when it runs, unless both ends agree)."""
    low, _, high = value.partition("-")
    if low.isdigit() and (not high or high == low):
        return low
    return None


def _gpus(value: str) -> str | None:
    """GPUs per node from ``--gres=gpu:8`` / ``gpu:h100:8`` / ``--gpus-per-node=8``."""
    for item in value.split(","):
        parts = item.split(":")
        if (parts[0] in ("gpu", "") or len(parts) == 1) and parts[-1].isdigit():
            return parts[-1]
    return None


def sbatch_inputs(options: Mapping[str, tuple[str, int]]) -> tuple[dict[str, str], list[str]]:
    """The variables Slurm sets from the header, and notes on what they came from."""
    env: dict[str, str] = {}
    notes: list[str] = []
    nodes = _count(options["nodes"][0]) if "nodes" in options else None
    if nodes is not None:
        env.update({"SLURM_NNODES": nodes, "SLURM_JOB_NUM_NODES": nodes})
        notes.append(f"line {options['nodes'][1]}: #SBATCH --nodes={nodes}")
    elif "nodes" in options:
        notes.append(f"line {options['nodes'][1]}: #SBATCH --nodes={options['nodes'][0]} is a "
                     "range: the node count is known only when the job starts")
    per_node = _count(options["ntasks-per-node"][0]) if "ntasks-per-node" in options else None
    if per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = per_node
        if nodes is not None:
            env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(int(nodes) * int(per_node))
    if "ntasks" in options and _count(options["ntasks"][0]):
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = options["ntasks"][0]
    for key in ("gres", "gpus-per-node"):
        if key in options:
            gpus = _gpus(options[key][0])
            if gpus is not None:
                env["SLURM_GPUS_ON_NODE"] = env["SLURM_GPUS_PER_NODE"] = gpus
    return env, notes


def node_inputs(nodes: int | None) -> dict[str, str]:
    """``--nodes N``: the node count every scheduler variable would carry."""
    return {name: str(nodes) for name in NODE_COUNT_VARIABLES} if nodes is not None else {}


# The line placer launch writes into the files it emits (a comment of megatron_args.sh and
# torchtitan.toml, a docstring line of torchtitan_config.py) so they state their world size.
PLACER_WORLD_RE = re.compile(r"^\s*#?\s*placer-world:\s*nodes=(\d+)\s+gpus_per_node=(\d+)\s*$",
                             re.M)


def placer_world(text: str) -> tuple[int, int, int] | None:
    """(nodes, GPUs per node, line) from a ``# placer-world: nodes=N gpus_per_node=G`` line."""
    match = PLACER_WORLD_RE.search(text)
    if match is None or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        return None
    return int(match.group(1)), int(match.group(2)), text.count("\n", 0, match.start()) + 1
