"""``placer launch PLAN.json --out DIR``: the files that start a plan's job."""

from __future__ import annotations

from pathlib import Path

import click

from placer.errors import PlacerError
from placer.launch import DEFAULT_MASTER_PORT, DEFAULT_SCRIPT, write_launch_files
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
def launch_command(plan_path: Path, out_dir: Path, candidate: int, script: str,
                   master_port: int, debug: bool, force: bool) -> None:
    """Write rankmap.json, placer_mesh.py, env.sh, launch.sh, job.sbatch, pytorchjob.yaml and
    Megatron/torchtitan/DeepSpeed configs for one candidate of PLAN.json."""
    plan = load_plan(plan_path)
    written = write_launch_files(plan, candidate, out_dir, script=script,
                                 master_port=master_port, debug=debug, force=force)
    click.echo(f"wrote {len(written)} files to {out_dir}:")
    for path in written:
        click.echo(f"  {path.name}")


COMMANDS = [launch_command]
