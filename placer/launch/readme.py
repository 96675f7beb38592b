"""README.md of a launch directory: what each file is, how to run it, and the caveats."""

from __future__ import annotations

from placer.launch.frameworks import deepspeed_notes, megatron_fit, torchtitan_fit
from placer.launch.rankmap import Placement
from placer.launch.scripts import placement_comment


def render_readme(placement: Placement, script: str, debug: bool) -> str:
    plan, layout = placement.plan, placement.layout
    candidate = placement.candidate
    lines = [
        f"# Launch files for {plan.job.name}",
        "",
        f"Candidate {placement.candidate_index} of the plan: layout `{layout}`, "
        f"{placement.world_size} GPUs on {len(placement.nodes)} node(s), estimated "
        f"{candidate.step_time_s:.3f} s per step ({candidate.tokens_per_s:,.0f} tokens/s, "
        f"MFU {candidate.mfu:.1%}).",
        "",
        "| file | what it is |",
        "|---|---|",
        "| `launch.sh` | torchrun with the static rendezvous; run once per node "
        "(`NODE_RANK=i MASTER_ADDR=<node 0> ./launch.sh`) |",
        "| `job.sbatch` | Slurm: `sbatch job.sbatch` from this directory |",
        "| `pytorchjob.yaml` | Kubeflow PyTorchJob; steps in its header |",
        "| `env.sh` | NCCL/torch environment, sourced by launch.sh"
        + (" (with debugging variables)" if debug else " (production settings)") + " |",
        "| `rankmap.json` | every rank's node, local rank, GPU, coordinates and groups |",
        "| `placer_mesh.py` | `import placer_mesh; pm = placer_mesh.setup()` in the training "
        "script: checks the launch, sets the device, builds the DeviceMesh and groups |",
        "| `megatron_args.sh` | Megatron-LM flags (`source` it, pass `\"${MEGATRON_ARGS[@]}\"`) |",
        "| `torchtitan.toml` | torchtitan `[parallelism]`, `[training]` and "
        "`[activation_checkpoint]` settings |",
        "| `deepspeed.json` | DeepSpeed ZeRO and batch settings |",
        "",
        f"The training script defaults to `{script}` (override with `PLACER_SCRIPT`). "
        "Dry run without GPUs: `PLACER_BACKEND=gloo` makes launch.sh hide the GPUs so the "
        "job runs on CPU with gloo.",
        "",
        "## Rank placement",
        "",
        *placement_comment(placement),
        "",
        "## Frameworks",
        "",
        f"- Megatron-LM: {megatron_fit(placement).explanation}",
        f"- torchtitan: {torchtitan_fit(placement).explanation}",
        *(f"- DeepSpeed: {note}" for note in deepspeed_notes(placement)),
        "",
    ]
    return "\n".join(lines)
