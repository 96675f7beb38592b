"""README.md of a launch directory: what each file is, how to run it, and the caveats."""

from __future__ import annotations

from placer.dialects import TARGETS, Refusal, deepspeed, megatron, megatron_bridge, torchtitan
from placer.launch.priced import StackPrice
from placer.launch.rankmap import PlacedCandidate
from placer.launch.scripts import placement_comment

# What each framework file is, for the README's table.
_FRAMEWORK_ROWS = {
    megatron.FILE: "Megatron-LM flags (`source` it, pass `\"${MEGATRON_ARGS[@]}\"`)",
    megatron_bridge.FILE: "Megatron-Bridge recipe overrides (ConfigContainer sections)",
    torchtitan.TOML_FILE: "torchtitan `[parallelism]`, `[training]` and "
                          "`[activation_checkpoint]` settings (TOML releases)",
    torchtitan.PY_FILE: "torchtitan Python config: `--module torchtitan_config --config "
                        "placer_job`",
    deepspeed.FILE: "DeepSpeed ZeRO and batch settings",
}


def render_readme(placement: PlacedCandidate, script: str, debug: bool,
                  versions: dict[str, str] | None = None, written: list[str] | None = None,
                  refused: list[Refusal] | None = None,
                  prices: list[StackPrice] | None = None) -> str:
    versions = versions or {name: t.default for name, t in TARGETS.items()}
    written = list(_FRAMEWORK_ROWS) if written is None else written
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
        *(f"| `{name}` | {_FRAMEWORK_ROWS[name]} |" for name in written),
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
        "Framework versions written for (`--framework-version TARGET=VERSION` picks others): "
        + ", ".join(f"{TARGETS[name].label} {series}" for name, series in versions.items())
        + " (defaults: " + ", ".join(f"{t.name}={t.default}" for t in TARGETS.values()) + ").",
        "",
        f"- Megatron-LM: {megatron.fit(placement).explanation}",
        f"- torchtitan: {torchtitan.fit(placement).explanation}",
        *(f"- DeepSpeed: {note}" for note in deepspeed.notes(placement)),
        *(f"- {refusal.line()}" for refusal in refused or []),
        *(f"- `{price.file}`: " + " ".join(price.lines()) for price in prices or []),
        "",
    ]
    return "\n".join(lines)
