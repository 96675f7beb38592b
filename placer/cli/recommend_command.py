"""``placer recommend-layout``: the front door. Inputs in, ranked layouts with the why out.

The command only wires things together: spec loaders and defaults, ``report.make_plan`` (solver,
common default, what-ifs, explanation), then the outputs: the human report or ``--json`` on
stdout, and ``--emit``/``--plot`` folders written all or nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from placer.cli import collector_off
from placer.cli.options import (
    NO_KNOBS,
    JobInputs,
    JobKnobs,
    job_input_options,
    knobs_from_params,
    load_job_inputs,
    load_profile_option,
)
from placer.launch.scripts import DEFAULT_MASTER_PORT, DEFAULT_SCRIPT
from placer.report.defaults import step_time_warnings
from placer.report.plan import (
    Recommendation,
    make_plan,
    plan_in_steps,
    plan_json,
    with_what_ifs_solved,
)
from placer.report.whatif import WhatIf
from placer.report.whatif import variants as what_if_variants
from placer.spec import Cluster

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


def _inputs(args: RecommendArgs) -> tuple[JobInputs, Any]:
    """The model, cluster and job (defaults filled) and the link profile the options name."""
    inputs = load_job_inputs(args.model, args.cluster, nodes=args.nodes,
                             global_batch=args.global_batch, seq_len=args.seq_len,
                             precision=args.precision, constraints=args.constraints,
                             knobs=args.knobs)
    return inputs, load_profile_option(args.profile)


def recommend(args: RecommendArgs, progress_enabled: bool = False) -> Recommendation:
    """Load the inputs, fill the defaults, and run the recommendation."""
    from placer.report.progress import delayed_spinner

    inputs, profile = _inputs(args)
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
@click.option("--quiet", "-q", is_flag=True,
              help="no progress lines or search time on stderr (warnings and errors still show)")
def recommend_layout_command(model_ref: str, cluster_ref: str, nodes: int | None,
                             global_batch: int | None, seq_len: int | None,
                             precision: str | None, top_k: int,
                             constraints: Sequence[str], profile: Path | None, what_if: bool,
                             as_json: bool,
                             emit_dir: Path | None, plot_dir: Path | None, script: str,
                             master_port: int, debug: bool, force: bool, quiet: bool,
                             job_knobs: JobKnobs) -> None:
    """Rank parallel layouts for a model on a cluster and explain the best one.

    Example: placer recommend-layout --model llama3-70b --cluster dgx-h100 --nodes 8
    """
    collector_off()  # run as a command, not in process (placer.cli.collector_off)
    if plot_dir is not None:
        from placer.report.plots import require_matplotlib

        require_matplotlib()
    from placer.io import refuse_nonempty_folders

    refuse_nonempty_folders(force, emit=emit_dir, plot=plot_dir)  # before, not after, the search
    from placer.launch.shell import checked

    checked(script, "script", "--script")
    before_search = None
    if emit_dir is not None:
        from placer.launch import require_nccl_gpus

        before_search = require_nccl_gpus
    args = RecommendArgs(model=model_ref, cluster=cluster_ref, nodes=nodes,
                         global_batch=global_batch, seq_len=seq_len, top_k=top_k,
                         constraints=tuple(constraints), profile=profile, what_if=what_if,
                         precision=precision, knobs=job_knobs)
    started = time.perf_counter()
    # The tables print no rank map: only the plan file, the launch files and the plots need one.
    rank_maps = as_json or emit_dir is not None or plot_dir is not None
    head, variants = recommend_in_steps(args, progress_enabled=not quiet,
                                        before_search=before_search, rank_maps=rank_maps)
    best = head.plan.candidates[0]
    for line in step_time_warnings(best.step_time_s, head.plan.job, best.layout.num_gpus):
        click.echo(f"warning: {line}", err=True)
    count = len(what_if_variants(head.plan.cluster, head.plan.job)) if what_if else 0
    variants = _with_progress(variants, count, enabled=not quiet)
    if as_json:
        rec = with_what_ifs_solved(head, list(variants))
    else:
        from placer.report.tables import stream_text

        rec = stream_text(head, variants, lambda solved: with_what_ifs_solved(head, solved),
                          lambda text: click.echo(text, nl=False))
    elapsed_s = time.perf_counter() - started
    written = []
    if emit_dir is not None or plot_dir is not None:
        written = write_outputs(rec, emit_dir, plot_dir, script=script, master_port=master_port,
                                debug=debug, force=force)
    if as_json:
        click.echo(plan_json(rec.plan), nl=False)
    elif not quiet:
        click.echo(f"(searched in {elapsed_s:.1f} s)", err=True)
    for path in written:
        click.echo(f"wrote {path}", err=True)


def recommend_in_steps(args: RecommendArgs, progress_enabled: bool = False,
                       before_search: Callable[[Cluster], None] | None = None,
                       rank_maps: bool = True) -> tuple[Recommendation, Iterator[WhatIf]]:
    """``recommend`` in two steps (``report.plan.plan_in_steps``): the answer, then the
    what-ifs solved one by one as the iterator is read. ``before_search`` checks the loaded
    cluster against the outputs asked for (``--emit``) before any search time is spent;
    ``rank_maps=False`` writes no rank maps (``plan_in_steps``)."""
    from placer.report.progress import delayed_spinner

    inputs, profile = _inputs(args)
    if before_search is not None:
        before_search(inputs.cluster)
    with delayed_spinner("searching layouts", enabled=progress_enabled) as progress:
        return plan_in_steps(inputs.model, inputs.cluster, inputs.job, top_k=args.top_k,
                             profile=profile, defaults_used=inputs.defaults_used,
                             with_what_ifs=args.what_if, progress=progress,
                             rank_maps=rank_maps)


def _with_progress(variants: Iterator[WhatIf], count: int, enabled: bool) -> Iterator[WhatIf]:
    """The what-ifs, each solved under its own progress line: none while they are quick, and
    once one has shown (it took long), every later one at once, so the count runs unbroken
    ("1 of 3", "2 of 3", "3 of 3", not "1 of 3", "3 of 3" where the second was quick)."""
    from placer.report import progress

    shown: list[bool] = []
    for index in range(1, count + 1):
        with progress.delayed_spinner(
                f"checking what would change the answer ({index} of {count})", enabled=enabled,
                delay_s=0.0 if shown else progress.DELAY_S, on_show=lambda: shown.append(True)):
            what = next(variants, None)
        if what is None:
            return
        yield what


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
