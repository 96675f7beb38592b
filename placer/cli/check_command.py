"""``placer check``: the CI gate that keeps TP inside a node (and the other layout rules)."""

from __future__ import annotations

from pathlib import Path

import click

from placer.check import FORMATS, RULES, CheckOptions, check_paths, render
from placer.check.world import parse_env
from placer.cli.options import load_profile_option
from placer.errors import InputError
from placer.spec.presets import load_cluster, load_model
from placer.spec.text import decimal

_EPILOG = """\b
CONFIG: Megatron-LM / Megatron-DeepSpeed launch script or argument list (any other
extension; read as bash would run it, #SBATCH headers included), torchtitan TOML (.toml),
DeepSpeed JSON, GPT-NeoX YAML, NeMo YAML, placer plan (plan.json) or layout file
(YAML/JSON with a `layout` key). Exit codes: 0 clean, 1 findings at or above --fail-on,
2 unreadable input (a readable file with no parallel settings is an info finding,
no-parallel-settings, not exit 2). Rules: placer check --list-rules.
"""


@click.command("check", epilog=_EPILOG)
@click.argument("configs", nargs=-1, metavar="CONFIG...")
@click.option("--cluster", "cluster_ref", metavar="C",
              help="cluster preset or file, for configs that do not name one")
@click.option("--model", "model_ref", metavar="M",
              help="model preset, model file or HF config.json (else from the config)")
@click.option("--nodes", type=click.IntRange(min=1),
              help="nodes, for configs that do not set their world size (a launch script "
              "sees it as SLURM_NNODES, SLURM_JOB_NUM_NODES, NNODES, NUM_NODES, PET_NNODES)")
@click.option("--env", "env_items", multiple=True, metavar="NAME=VALUE",
              help="a variable a launch script reads from its environment (repeatable)")
@click.option("--seq-len", type=click.IntRange(min=1),
              help="sequence length, for configs that do not set one")
@click.option("--candidate", default="all", show_default=True, metavar="N|all",
              help="plans: check candidate N only (0 is what placer launch uses), or all")
@click.option("--fail-on", type=click.Choice(["error", "warning"]), default="error",
              show_default=True, help="lowest severity that makes the exit code 1")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="github: Actions annotations on the offending line; json: for other CI")
@click.option("--list-rules", is_flag=True, help="print every rule id, severity and meaning")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), metavar="FILE",
              help="calibrated profile (placer calibrate): the memory rule uses its memory terms")
def check_command(configs: tuple[str, ...], cluster_ref: str | None, model_ref: str | None,
                  nodes: int | None, env_items: tuple[str, ...], seq_len: int | None,
                  candidate: str, fail_on: str, fmt: str, list_rules: bool,
                  profile_path: Path | None) -> int:
    """Check parallel configs against a cluster: TP inside NVLink, EP/CP/PP placement,
    degrees, memory and rank maps."""
    if list_rules:
        for rule in RULES.values():
            click.echo(f"{rule.id:<22} {rule.severity:<8} {rule.summary}")
        return 0
    if not configs:
        raise click.UsageError("give at least one CONFIG")
    index = decimal(candidate)
    if candidate != "all" and index is None:
        raise InputError("--candidate", candidate, "use a candidate index (0 = best) or all")
    options = CheckOptions(
        cluster=load_cluster(cluster_ref) if cluster_ref else None,
        model=load_model(model_ref) if model_ref else None,
        nodes=nodes, seq_len=seq_len, candidate=index,
        env=tuple(sorted(parse_env(env_items).items())),
        profile=load_profile_option(profile_path))
    report = check_paths(configs, options, fail_on)
    if fmt == "text":
        for problem in report.problems:
            click.echo(f"error: {problem.message}", err=True)
    click.echo(render(report, fmt))
    return report.exit_code


COMMANDS = [check_command]
