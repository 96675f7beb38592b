"""``placer launch PLAN.json --out DIR``: the files that start a plan's job."""

from __future__ import annotations

from pathlib import Path

import click

from placer.dialects import TARGETS, resolve_versions
from placer.errors import PlacerError
from placer.launch import DEFAULT_MASTER_PORT, DEFAULT_SCRIPT, render_bundle, write_files
from placer.spec import Plan
from placer.spec.presets import read_document, validated


def load_plan(path: Path) -> Plan:
    data = read_document(path)
    if not isinstance(data, dict):
        raise PlacerError(f"{path}: expected a placer plan (a JSON object)")
    return validated(Plan, data, str(path))


@click.command("launch")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="directory to write the launch files into")
@click.option("--candidate", default=0, show_default=True, type=click.IntRange(min=0),
              help="which candidate of the plan (0 = best)")
@click.option("--script", default=DEFAULT_SCRIPT, show_default=True,
              help="training script torchrun runs (PLACER_SCRIPT overrides it at run time)")
@click.option("--master-port", default=DEFAULT_MASTER_PORT, show_default=True,
              type=click.IntRange(1, 65535), help="rendezvous port on node 0")
@click.option("--debug", is_flag=True, help="add NCCL/torch debugging variables to env.sh")
@click.option("--force", is_flag=True, help="replace files that already exist in --out")
@click.option("--framework-version", "framework_versions", multiple=True, metavar="TARGET=VER",
              help="framework release to write for, repeatable: "
              + ", ".join(f"{t.name} ({'/'.join(t.series)}; default {t.default})"
                          for t in TARGETS.values()))
def launch_command(plan_path: Path, out_dir: Path, candidate: int, script: str,
                   master_port: int, debug: bool, force: bool,
                   framework_versions: tuple[str, ...]) -> None:
    """Write rankmap.json, placer_mesh.py, env.sh, launch.sh, job.sbatch, pytorchjob.yaml and
    Megatron/torchtitan/DeepSpeed configs for one candidate of PLAN.json."""
    plan = load_plan(plan_path)
    made = render_bundle(plan, candidate, script=script, master_port=master_port,
                         debug=debug, framework_versions=framework_versions)
    written = write_files(out_dir, made.files, force=force)
    versions = resolve_versions(framework_versions)
    click.echo(f"wrote {len(written)} files to {out_dir} (framework versions: "
               + ", ".join(f"{name} {series}" for name, series in versions.items())
               + "; --framework-version TARGET=VERSION picks others):")
    for path in written:
        click.echo(f"  {path.name}")
    for refusal in made.refused:
        click.echo(f"warning: {refusal.line()}", err=True)
    for line in made.warnings():
        click.echo(f"warning: {line}", err=True)


COMMANDS = [launch_command]
