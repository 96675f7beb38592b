"""``placer recommend-layout``: the front door. Inputs in, ranked layouts with the why out.

The command only wires things together: spec loaders and defaults, ``report.make_plan`` (solver,
common default, what-ifs, explanation), then the outputs: the human report or ``--json`` on
stdout, and ``--emit``/``--plot`` folders written all or nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from placer.cli.options import (
    NO_KNOBS,
    JobKnobs,
    job_input_options,
    knobs_from_params,
    load_job_inputs,
    load_profile_option,
)
from placer.launch.scripts import DEFAULT_MASTER_PORT, DEFAULT_SCRIPT
from placer.report.defaults import step_time_warnings
from placer.report.plan import Recommendation, make_plan, plan_json

DEFAULT_TOP_K = 5


@dataclass(frozen=True)
class RecommendArgs:
    """Every input of the command, as parsed from its flags (the examples reuse this)."""

    model: str
    cluster: str
    nodes: int | None = None
    global_batch: int | None = None
    seq_len: int | None = None
    top_k: int = DEFAULT_TOP_K
    constraints: tuple[str, ...] = ()
    profile: Path | None = None
    what_if: bool = True
    precision: str | None = None
    knobs: JobKnobs = NO_KNOBS


def recommend(args: RecommendArgs, progress_enabled: bool = False) -> Recommendation:
    """Load the inputs, fill the defaults, and run the recommendation."""
    from placer.report.progress import delayed_spinner

    inputs = load_job_inputs(args.model, args.cluster, nodes=args.nodes,
                             global_batch=args.global_batch, seq_len=args.seq_len,
                             precision=args.precision, constraints=args.constraints,
                             knobs=args.knobs)
    profile = load_profile_option(args.profile)
    with delayed_spinner("searching layouts", enabled=progress_enabled) as progress:
        return make_plan(inputs.model, inputs.cluster, inputs.job, top_k=args.top_k,
                         profile=profile, defaults_used=inputs.defaults_used,
                         with_what_ifs=args.what_if, progress=progress)


@click.command("recommend-layout")
@job_input_options
@click.option("--top", "top_k", type=click.IntRange(1, 50), default=DEFAULT_TOP_K,
              show_default=True, metavar="K", help="how many layouts to rank")
@click.option("--constraint", "constraints", multiple=True, metavar="EXPR",
              help="degree rule, repeatable: 'tp<=4', 'pp in 2,4', 'zero>=1', 'recompute=full'")
@click.option("--profile", type=click.Path(path_type=Path), metavar="FILE",
              help="measured link profile (from 'placer calibrate') to use in the cost model")
@click.option("--what-if/--no-what-if", "what_if", default=True, show_default=True,
              help="also solve at half/twice the batch and twice the nodes to say what would "
                   "change the answer (about 3x the search time)")
@click.option("--json", "as_json", is_flag=True,
              help="print the whole plan as JSON (see 'placer schema plan') instead of tables")
@click.option("--emit", "emit_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="write plan.json and the launch files of the best layout into DIR")
@click.option("--plot", "plot_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="draw rankmap.png/svg and breakdown.png/svg into DIR (needs matplotlib)")
@click.option("--script", default=DEFAULT_SCRIPT, show_default=True, metavar="SCRIPT",
              help="training script the emitted launch.sh runs")
@click.option("--master-port", type=click.IntRange(1, 65535), default=DEFAULT_MASTER_PORT,
              metavar="PORT", show_default=True, help="rendezvous port of the emitted launch files")
@click.option("--debug", is_flag=True, help="add NCCL/torch debugging variables to emitted env.sh")
@click.option("--force", is_flag=True, help="overwrite files already in --emit/--plot folders")
def recommend_layout_command(model_ref: str, cluster_ref: str, nodes: int | None,
                             global_batch: int | None, seq_len: int | None,
                             precision: str | None, top_k: int,
                             constraints: Sequence[str], profile: Path | None, what_if: bool,
                             as_json: bool,
                             emit_dir: Path | None, plot_dir: Path | None, script: str,
                             master_port: int, debug: bool, force: bool,
                             job_knobs: JobKnobs) -> None:
    """Rank parallel layouts for a model on a cluster and explain the best one.

    Example: placer recommend-layout --model llama3-70b --cluster dgx-h100 --nodes 8
    """
    if plot_dir is not None:
        from placer.report.plots import require_matplotlib

        require_matplotlib()
    args = RecommendArgs(model=model_ref, cluster=cluster_ref, nodes=nodes,
                         global_batch=global_batch, seq_len=seq_len, top_k=top_k,
                         constraints=tuple(constraints), profile=profile, what_if=what_if,
                         precision=precision, knobs=job_knobs)
    started = time.perf_counter()
    rec = recommend(args, progress_enabled=not as_json)
    elapsed_s = time.perf_counter() - started
    best = rec.plan.candidates[0]
    for line in step_time_warnings(best.step_time_s, rec.plan.job, best.layout.num_gpus):
        click.echo(f"warning: {line}", err=True)
    if emit_dir is not None or plot_dir is not None:
        written = write_outputs(rec, emit_dir, plot_dir, script=script, master_port=master_port,
                                debug=debug, force=force)
    else:
        written = []
    if as_json:
        click.echo(plan_json(rec.plan), nl=False)
    else:
        from placer.report.tables import render_text

        click.echo(render_text(rec), nl=False)
        click.echo(f"(searched in {elapsed_s:.1f} s)", err=True)
    for path in written:
        click.echo(f"wrote {path}", err=True)


def write_outputs(rec: Recommendation, emit_dir: Path | None, plot_dir: Path | None, *,
                  script: str = DEFAULT_SCRIPT, master_port: int = DEFAULT_MASTER_PORT,
                  debug: bool = False, force: bool = False) -> list[Path]:
    """Produce --emit and --plot folders together, all or nothing."""
    from placer.io import Producer, write_folders

    jobs: list[tuple[Path, Producer]] = []
    if emit_dir is not None:
        def emit(stage: Path) -> list[Path]:
            from placer.launch import write_launch_files

            plan_path = stage / "plan.json"
            plan_path.write_text(plan_json(rec.plan), encoding="utf-8")
            launch = write_launch_files(rec.plan, 0, stage, script=script,
                                        master_port=master_port, debug=debug, force=True)
            return [plan_path, *launch]

        jobs.append((emit_dir, emit))
    if plot_dir is not None:
        def plot(stage: Path) -> list[Path]:
            from placer.report.plots import plot_recommendation

            return plot_recommendation(rec, stage)

        jobs.append((plot_dir, plot))
    return write_folders(jobs, force=force)


def args_from_argv(argv: Sequence[str]) -> RecommendArgs:
    """Parse the command's flags exactly as the command would (used by examples/regenerate.py)."""
    with recommend_layout_command.make_context("recommend-layout", list(argv)) as ctx:
        p = ctx.params
    return RecommendArgs(model=p["model_ref"], cluster=p["cluster_ref"], nodes=p["nodes"],
                         global_batch=p["global_batch"], seq_len=p["seq_len"], top_k=p["top_k"],
                         constraints=tuple(p["constraints"]), profile=p["profile"],
                         what_if=p["what_if"], precision=p["precision"],
                         knobs=knobs_from_params(p))


COMMANDS = [recommend_layout_command]
