"""``placer calibrate`` and ``placer verify``: measure the hardware, check the plan on it.

Both run workers under torchrun: on an emulated cluster (``--emulate NODESxGPUS``: network
namespaces, tbf-shaped links, gloo on CPU), or on this machine (``torchrun --standalone``, NCCL
when CUDA is present). For a real multi-node cluster, ``calibrate --emit-config DIR`` writes the
worker's config and prints the command to run under your own launcher; ``calibrate --from`` then
fits the file it writes.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from placer.errors import InputError, PlacerError
from placer.io import refuse_existing, write_text
from placer.spec.cluster import Cluster
from placer.spec.profile import LinkProfile

if TYPE_CHECKING:
    from placer.spec import Plan
    from placer.verify.calibrate import CalibrationResult
    from placer.verify.feedback import Feedback
    from placer.verify.realmodel import RealResult
    from placer.verify.runner import Launcher
    from placer.verify.session import CandidateResult, VerifyOptions
    from placer.verify.slurm import SlurmClient, SlurmOptions

DEFAULT_TIMEOUT_S = 300.0


def _launcher(emulate: str | None, inter_node_mbit: float | None, nproc: int | None,
              default_nproc: int) -> Launcher:
    from placer.verify.emulate import parse_emulate_spec
    from placer.verify.runner import EmulatedLauncher, LocalLauncher

    if emulate is not None:
        if nproc is not None:
            raise InputError("--nproc", nproc, "use either --emulate or --nproc, not both")
        nodes, gpus = parse_emulate_spec(emulate)
        return EmulatedLauncher(nodes, gpus, inter_node_mbit)
    if inter_node_mbit is not None:
        raise InputError("--inter-node-mbit", inter_node_mbit, "it shapes --emulate links; "
                         "add --emulate NODESxGPUS")
    return LocalLauncher(nproc if nproc is not None else default_nproc)


def _cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        raise PlacerError("calibrate and verify need torch: from a checkout, pip install -e "
                          "'.[verify]' torch==2.13.0 (the README's test setup)") from None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _make_folder(path: Path, option: str) -> None:
    """``mkdir -p`` of an output folder, a user error when it cannot be made there."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlacerError(f"{option}: cannot make {path} ({exc.strerror or exc}); choose "
                          "another folder") from None


@contextmanager
def _work_dir(given: Path | None, prefix: str) -> Iterator[tuple[Path, list[bool]]]:
    """The given directory (kept), or a temporary one removed unless ``keep[0]`` is set."""
    if given is not None:
        _make_folder(given, "--work-dir")
        yield given, [True]
        return
    path = Path(tempfile.mkdtemp(prefix=prefix))
    keep = [False]
    try:
        yield path, keep
    finally:
        if not keep[0]:
            shutil.rmtree(path, ignore_errors=True)


def _write_profile(path: Path, profile: LinkProfile, option: str) -> None:
    from placer.verify.calibrate import profile_yaml

    write_text(path, profile_yaml(profile), option)


def _say(text: str, to_stderr: bool) -> None:
    click.echo(text, err=to_stderr)


def _emulated_or(cluster_ref: str | None, emulate: str | None, mbit: float | None,
                 nproc: int, cuda: bool) -> Cluster:
    """The cluster whose GPU peak GEMM efficiency is measured against."""
    from placer.spec.presets import load_cluster
    from placer.verify.cpu_cluster import emulated_cluster
    from placer.verify.emulate import parse_emulate_spec

    if cluster_ref is not None:
        return load_cluster(cluster_ref)
    if emulate is not None:
        return emulated_cluster(*parse_emulate_spec(emulate), mbit)
    if cuda:
        raise InputError("--cluster", None, "on GPUs, name the cluster (preset or file) so GEMM "
                         "efficiency is measured against its GPU's peak")
    return emulated_cluster(1, nproc, None)


def run_calibration(launcher: Launcher, cluster: Cluster, work_dir: Path, largest: int | None,
                    timeout_s: float, cuda: bool) -> CalibrationResult:
    """Sweep, fit, and return the CalibrationResult (shared by calibrate and verify)."""
    from placer.verify.calibrate import calibrate_from_bench, default_sweep, gemm_only, run_bench

    sweep = default_sweep(cuda, largest)
    bench = run_bench(launcher, sweep, work_dir, timeout_s)
    gpu = cluster.node_types[0].gpu
    if bench["world_size"] < 2:
        return gemm_only(bench, gpu, cluster.name)
    return calibrate_from_bench(bench, gpu, cluster.name, str(work_dir / "bench.json"))


# ------------------------------------------------------------------ calibrate


@click.command("calibrate")
@click.option("--emulate", metavar="NODESxGPUS",
              help="emulate a cluster here: one network namespace per node, gloo on CPU")
@click.option("--inter-node-mbit", type=click.FloatRange(min=0, min_open=True), metavar="R",
              help="rate of each emulated node's link (tbf), Mbit/s; unshaped if absent")
@click.option("--nproc", type=click.IntRange(min=1), metavar="N",
              help="ranks of a local torchrun --standalone (default: CUDA devices, or 2)")
@click.option("--cluster", "cluster_ref", metavar="C",
              help="cluster preset or file whose GPU peak the GEMM efficiency is relative to "
                   "(default with --emulate or on CPU: the emulated CPU cluster)")
@click.option("--max-message-mib", type=click.IntRange(min=1), metavar="M",
              help="largest message (default: 16 MiB on CPU, 256 MiB on GPUs)")
@click.option("--full-sweep", is_flag=True, help="messages up to 256 MiB even on CPU")
@click.option("--out", "out_path", type=click.Path(path_type=Path), metavar="FILE",
              help="write the link profile (YAML) here, for --profile")
@click.option("--json", "as_json", is_flag=True,
              help="print the fitted profile as JSON on stdout (residuals go to stderr)")
@click.option("--from", "from_path", type=click.Path(path_type=Path), metavar="BENCH.json",
              help="fit measurements already taken (by the worker under your own launcher)")
@click.option("--emit-config", type=click.Path(path_type=Path), metavar="DIR",
              help="write the worker config to DIR and print the command for a real cluster")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=DEFAULT_TIMEOUT_S,
              show_default=True, help="time limit of the measuring run")
@click.option("--work-dir", type=click.Path(path_type=Path), metavar="DIR",
              help="keep the worker's config, measurements and logs here")
@click.option("--real-model", "real_model_paths", multiple=True,
              type=click.Path(path_type=Path), metavar="RESULTS.json",
              help="fit the profile's memory terms and GEMM efficiency to what 'placer verify "
                   "--real-model --out' measured (repeatable; alone, or after a sweep)")
@click.option("--profile", "base_profile", type=click.Path(path_type=Path), metavar="FILE",
              help="with --real-model alone: the profile to add the fitted terms to (default: "
                   "the one the runs were predicted with)")
@click.option("--force", is_flag=True, help="overwrite --out or --emit-config's config file")
def calibrate_command(emulate: str | None, inter_node_mbit: float | None, nproc: int | None,
                      cluster_ref: str | None, max_message_mib: int | None, full_sweep: bool,
                      out_path: Path | None, as_json: bool, from_path: Path | None,
                      emit_config: Path | None, timeout_s: float, work_dir: Path | None,
                      real_model_paths: tuple[Path, ...], base_profile: Path | None,
                      force: bool) -> None:
    """Measure collectives (inside and across nodes) and GEMMs; fit a link profile.

    Example: placer calibrate --emulate 2x2 --inter-node-mbit 400 --out profile.yaml
    """
    from placer.verify.calibrate import (
        GPU_LARGEST_MESSAGE_BYTES,
        MIB,
        bench_config,
        calibrate_from_bench,
        default_sweep,
        gemm_only,
        load_bench,
        profile_document,
        report_lines,
    )
    from placer.verify.runner import torchrun_hint

    largest = GPU_LARGEST_MESSAGE_BYTES if full_sweep else (
        max_message_mib * MIB if max_message_mib else None)
    refuse_existing(force, out=out_path,  # --emit-config's folder is made when it is missing
                    emit_config=emit_config / "bench_config.json"
                    if emit_config and emit_config.is_dir() else None)
    measuring = from_path is not None or emit_config is not None or emulate is not None \
        or nproc is not None
    if base_profile is not None and (not real_model_paths or measuring):
        raise InputError("--profile", str(base_profile), "it is the base --real-model adds its "
                         "terms to; use it with --real-model alone")
    if real_model_paths and emit_config is not None:
        raise InputError("--real-model", str(real_model_paths[0]), "--emit-config only writes "
                         "the sweep's config; fit the results once it has run")
    if real_model_paths and not measuring:
        _calibrate_real(real_model_paths, base_profile, out_path, as_json)
        return
    if from_path is not None:
        bench = load_bench(from_path)
        cluster = _emulated_or(cluster_ref, emulate, inter_node_mbit, bench["world_size"],
                               bench.get("backend") == "nccl")
        gpu = cluster.node_types[0].gpu
        cal = (gemm_only(bench, gpu, cluster.name) if bench["world_size"] < 2
               else calibrate_from_bench(bench, gpu, cluster.name, str(from_path)))
    elif emit_config is not None:
        if cluster_ref is None:
            raise InputError("--cluster", None, "--emit-config needs the cluster it will run on")
        from placer.spec.presets import load_cluster

        cluster = load_cluster(cluster_ref)
        node_type = cluster.node_types[0]
        config = bench_config(default_sweep(True, largest), cluster.num_nodes,
                              node_type.gpus_per_node, timeout_s=timeout_s)
        try:
            emit_config.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PlacerError(f"--emit-config: cannot create {emit_config}: "
                              f"{exc.strerror or exc}") from None
        config_path = emit_config / "bench_config.json"
        write_text(config_path, json.dumps(config, indent=1, sort_keys=True) + "\n",
                   "--emit-config")
        argv = ["-m", "placer.verify.workers.bench", str(config_path), str(emit_config)]
        click.echo(f"wrote {config_path}; on every node (placer installed) run:")
        click.echo("  " + torchrun_hint(cluster.num_nodes, node_type.gpus_per_node, argv))
        click.echo(f"then: placer calibrate --from {emit_config / 'bench.json'} "
                   f"--cluster {cluster_ref} --out profile.yaml")
        return
    else:
        cuda = _cuda_devices() > 0
        default_nproc = _cuda_devices() if cuda else 2
        cluster = _emulated_or(cluster_ref, emulate, inter_node_mbit, nproc or default_nproc,
                               cuda and emulate is None)
        with _work_dir(work_dir, "placer-calibrate-") as (where, keep), \
                _launcher(emulate, inter_node_mbit, nproc, default_nproc) as launcher:
            _say(f"calibrating on {launcher.description}", as_json)
            try:
                cal = run_calibration(launcher, cluster, where, largest, timeout_s,
                                      cuda and emulate is None)
            except PlacerError:
                keep[0] = True
                raise
    for line in report_lines(cal):
        _say(line, as_json)
    profile = cal.profile
    if real_model_paths:
        _calibrate_real(real_model_paths, profile, out_path, as_json)
        return
    if out_path is not None:
        _write_profile(out_path, profile, "--out")
        _say(f"wrote {out_path}", as_json)
    if as_json:
        click.echo(json.dumps(profile_document(profile), indent=2))


def _calibrate_real(paths: tuple[Path, ...], base: LinkProfile | Path | None,
                    out_path: Path | None, as_json: bool) -> None:
    """``calibrate --real-model``: memory terms and GEMM efficiency from real-model runs."""
    from placer.spec.profile import load_link_profile
    from placer.verify.calibrate import profile_document
    from placer.verify.real_calibrate import calibrate_real, load_real_results, real_report_lines

    docs = [(str(path), load_real_results(path)) for path in paths]
    if isinstance(base, Path):
        base = load_link_profile(base)
    cal = calibrate_real(docs, base)
    for line in real_report_lines(cal):
        _say(line, as_json)
    if out_path is not None:
        _write_profile(out_path, cal.profile, "--out")
        _say(f"wrote {out_path}", as_json)
    if as_json:
        click.echo(json.dumps(profile_document(cal.profile), indent=2))


# ------------------------------------------------------------------ verify


@click.command("verify")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(path_type=Path))
@click.option("--top", "top_k", type=click.IntRange(1, 50), default=5, show_default=True,
              metavar="K", help="how many of the plan's candidates to run (best first; 5 is "
              "every candidate of a default recommend-layout plan)")
@click.option("--emulate", metavar="NODESxGPUS",
              help="emulate the plan's cluster here: network namespaces, gloo on CPU")
@click.option("--inter-node-mbit", type=click.FloatRange(min=0, min_open=True), metavar="R",
              help="rate of each emulated node's link (tbf), Mbit/s; unshaped if absent")
@click.option("--nproc", type=click.IntRange(min=1), metavar="N",
              help="ranks of a local torchrun --standalone (default: the plan's GPU count)")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path), metavar="FILE",
              help="link profile to predict with (default: calibrate on the same ranks first)")
@click.option("--scale", type=click.FloatRange(0, 1, min_open=True), default=1.0,
              show_default=True, help="shrink every message and the compute by this factor "
              "(--real-model: the model's widths and vocabulary)")
@click.option("--steps", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="timed steps per candidate (after --warmup-steps)")
@click.option("--warmup-steps", type=click.IntRange(0, 100), default=1, show_default=True)
@click.option("--timeout-s", type=click.FloatRange(min=1), default=180.0, show_default=True,
              help="time limit of each candidate's run (and of the calibration)")
@click.option("--calibrate", "refit", is_flag=True,
              help="refit the profile from the replays, re-predict and re-rank")
@click.option("--save-profile", type=click.Path(path_type=Path), metavar="FILE",
              help="with --calibrate: write the refitted profile (YAML)")
@click.option("--out", "out_path", type=click.Path(path_type=Path), metavar="FILE",
              help="write the results JSON here, updated as each candidate finishes")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON on stdout")
@click.option("--work-dir", type=click.Path(path_type=Path), metavar="DIR",
              help="keep launch files, replay programs, measurements and logs here")
@click.option("--emit-config", type=click.Path(path_type=Path), metavar="DIR",
              help="write each candidate's launch files and replay program to DIR (on a file "
                   "system every node sees) and print the commands for a real cluster")
@click.option("--from", "from_dir", type=click.Path(path_type=Path), metavar="DIR",
              help="compare the replays a real cluster ran from --emit-config DIR")
@click.option("--slurm", is_flag=True,
              help="submit each candidate as its own Slurm job (its job.sbatch); needs "
                   "--work-dir on a file system the nodes see; a rerun resumes")
@click.option("--partition", metavar="P", help="with --slurm: sbatch --partition")
@click.option("--account", metavar="A", help="with --slurm: sbatch --account")
@click.option("--time", "time_limit", metavar="T",
              help="with --slurm: sbatch --time (default: --timeout-s plus 2 minutes)")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="ARG",
              help="with --slurm: one more sbatch option (repeatable), e.g. --sbatch-arg=--qos=x")
@click.option("--real-model", is_flag=True,
              help="train each candidate's actual model (random weights) for --steps steps "
                   "instead of the replay: step time, tokens/s and peak memory")
@click.option("--force", is_flag=True, help="overwrite --out and --save-profile files")
def verify_command(plan_path: Path, top_k: int, emulate: str | None,
                   inter_node_mbit: float | None, nproc: int | None, profile_path: Path | None,
                   scale: float, steps: int, warmup_steps: int, timeout_s: float, refit: bool,
                   save_profile: Path | None, out_path: Path | None, as_json: bool,
                   work_dir: Path | None, emit_config: Path | None, from_dir: Path | None,
                   slurm: bool, partition: str | None, account: str | None,
                   time_limit: str | None, sbatch_args: tuple[str, ...], real_model: bool,
                   force: bool) -> None:
    """Run the plan's top candidates for real and compare measured with predicted step times.

    Example: placer verify examples/emulated-2x2/plan.json --emulate 2x2 --inter-node-mbit 400
    """
    from placer.cli.launch_command import load_plan
    from placer.spec.profile import load_link_profile
    from placer.verify.output import candidate_line, results_document
    from placer.verify.session import VerifyOptions, verify_plan

    if save_profile is not None and not refit:
        raise InputError("--save-profile", str(save_profile), "it writes the --calibrate refit; "
                         "add --calibrate")
    refuse_existing(force, out=out_path, save_profile=save_profile)
    plan = load_plan(plan_path)
    folder = emit_config or from_dir
    if profile_path is None and folder is not None and (folder / "profile.yaml").is_file():
        profile_path = folder / "profile.yaml"
    profile = load_link_profile(profile_path) if profile_path is not None else None
    options = VerifyOptions(top_k=top_k, scale=scale, steps=steps, warmup_steps=warmup_steps,
                            candidate_timeout_s=timeout_s, refit=refit)
    if emit_config is not None:
        _emit_replays(plan_path, plan, profile, options, emit_config)
        return
    if slurm:
        _verify_slurm(plan_path, plan, profile, str(profile_path or "cost model presets"),
                      options, work_dir, (partition, account, time_limit, sbatch_args),
                      (emulate, nproc, from_dir), out_path, save_profile, as_json, real_model)
        return
    for flag, value in (("--partition", partition), ("--account", account),
                        ("--time", time_limit), ("--sbatch-arg", " ".join(sbatch_args) or None)):
        if value is not None:
            raise InputError(flag, value, "it is an sbatch option; add --slurm")
    if from_dir is not None:
        results, summary, fb = verify_plan(plan, None, profile, options, from_dir)
        doc = results_document(str(plan_path), f"results in {from_dir}", options,
                               str(profile_path or "cost model presets"), results, summary, fb)
        _finish(doc, results, fb, out_path, save_profile, as_json)
        return
    default_nproc = plan.candidates[0].layout.num_gpus if plan.candidates else 1
    _check_shapes(plan, options, emulate, nproc or default_nproc, as_json)
    if real_model:
        from placer.verify.realmodel import scaled_plan

        plan = scaled_plan(plan, scale)
        _verify_real(plan_path, plan, profile, options, (emulate, inter_node_mbit, nproc,
                     default_nproc), work_dir, out_path, as_json, save_profile)
        return
    cuda = _cuda_devices() > 0
    with _work_dir(work_dir, "placer-verify-") as (where, keep), \
            _launcher(emulate, inter_node_mbit, nproc, default_nproc) as launcher:
        _say(f"verifying {plan_path} on {launcher.description}", as_json)
        _note_rate_mismatch(plan.cluster, emulate, inter_node_mbit, as_json)
        source = str(profile_path) if profile_path else "calibrated before the replays"
        if profile is None:
            cal = run_calibration(launcher, plan.cluster, where / "calibration", None,
                                  timeout_s, cuda and emulate is None)
            profile = cal.profile
            for line in _short_fits(cal):
                _say(line, as_json)

        def arrived(result: CandidateResult, so_far: list[CandidateResult]) -> None:
            _say(candidate_line(result), as_json)
            if out_path is not None:
                _write_json(out_path, results_document(str(plan_path), launcher.description,
                                                       options, source, so_far, None, None))

        results, summary, fb = verify_plan(plan, launcher, profile, options, where, arrived)
        doc = results_document(str(plan_path), launcher.description, options, source, results,
                               summary, fb)
        if any(r.status != "ok" for r in results):
            keep[0] = True
            _say(f"logs of the failed candidates are in {where}", as_json)
        if not cuda:
            from placer.verify.cpu_cluster import oversubscription_note

            note = oversubscription_note(launcher.world_size)
            if note is not None:
                _say(note, as_json)
    _finish(doc, results, fb, out_path, save_profile, as_json)


def _verify_slurm(plan_path: Path, plan: Plan, profile: LinkProfile | None, source: str,
                  options: VerifyOptions, work_dir: Path | None,
                  sbatch: tuple[str | None, str | None, str | None, tuple[str, ...]],
                  others: tuple[str | None, int | None, Path | None], out_path: Path | None,
                  save_profile: Path | None, as_json: bool, real_model: bool) -> None:
    """``verify --slurm``: every candidate as a Slurm job; finished ones are read back."""
    from placer.verify.output import candidate_line, results_document
    from placer.verify.session import verify_plan_slurm
    from placer.verify.slurm import SlurmClient, SlurmOptions

    for flag, value in zip(("--emulate", "--nproc", "--from"), others, strict=True):
        if value is not None:
            raise InputError(flag, str(value), "--slurm runs the candidates on the cluster "
                             "Slurm gives; drop one of the two")
    if work_dir is None:
        raise InputError("--work-dir", None, "--slurm needs a folder on a file system every "
                         "node sees (the jobs write their results there; a rerun resumes "
                         "from it)")
    if options.refit and profile is None:
        raise InputError("--profile", None, "--calibrate refits a link profile; run placer "
                         "calibrate on the cluster first and pass it with --profile")
    partition, account, time_limit, sbatch_args = sbatch
    client = SlurmClient()
    work_dir.mkdir(parents=True, exist_ok=True)
    where = f"Slurm{f' partition {partition}' if partition else ''} (one job per candidate)"
    _say(f"verifying {plan_path} on {where}", as_json)
    slurm_options = SlurmOptions(partition, account, time_limit, tuple(sbatch_args))
    if real_model:
        from placer.verify.realmodel import scaled_plan

        plan = scaled_plan(plan, options.scale)
        _real_on_slurm(plan_path, plan, profile, options, client, slurm_options,
                       work_dir.absolute(), where, out_path, save_profile, as_json)
        return

    def arrived(result: CandidateResult, so_far: list[CandidateResult]) -> None:
        _say(candidate_line(result), as_json)
        if out_path is not None:
            _write_json(out_path, results_document(str(plan_path), where, options, source,
                                                   so_far, None, None))

    def resumed(result: CandidateResult) -> None:
        _say(f"{candidate_line(result)} (results of an earlier run in {work_dir}, not re-run)",
             as_json)

    results, summary, fb = verify_plan_slurm(
        plan, client, slurm_options, profile, options, work_dir.absolute(), arrived, resumed)
    doc = results_document(str(plan_path), where, options, source, results, summary, fb)
    if any(r.status != "ok" for r in results):
        _say(f"logs of the failed candidates are in {work_dir}/candidate*/logs; run the same "
             "command again to re-run only them", as_json)
    _finish(doc, results, fb, out_path, save_profile, as_json)


def _verify_real(plan_path: Path, plan: Plan, profile: LinkProfile | None,
                 options: VerifyOptions, where: tuple[str | None, float | None, int | None, int],
                 work_dir: Path | None, out_path: Path | None, as_json: bool,
                 save_profile: Path | None) -> None:
    """``verify --real-model``: the candidates' models, for a few steps each; with
    ``--calibrate`` the profile's GEMM efficiency is refitted from their step times."""
    from placer.verify.realmodel import real_line, run_real
    from placer.verify.session import top_indices

    if options.refit and profile is None:
        raise InputError("--profile", None, "--real-model --calibrate refits a link profile; "
                         "run placer calibrate first and pass it with --profile")
    device = "cuda" if _cuda_devices() > 0 else "cpu"
    emulate, mbit, nproc, default_nproc = where
    with _work_dir(work_dir, "placer-verify-") as (folder, keep), \
            _launcher(emulate, mbit, nproc, default_nproc) as launcher:
        _say(f"training the real model of {plan_path}'s candidates on {launcher.description}",
             as_json)
        results = run_real(plan, launcher, profile, top_indices(plan, options), folder,
                           options.steps, options.warmup_steps, options.candidate_timeout_s,
                           device)
        for result in results:
            _say(real_line(result), as_json)
        if any(r.status not in ("ok", "skipped") for r in results):
            keep[0] = True
            _say(f"logs of the failed candidates are in {folder}", as_json)
        description = launcher.description
    _finish_real(plan_path, plan, profile, options, description, results, out_path,
                 save_profile, as_json)


def _finish_real(plan_path: Path, plan: Plan, profile: LinkProfile | None,
                 options: VerifyOptions, where: str, results: list[RealResult],
                 out_path: Path | None, save_profile: Path | None, as_json: bool) -> None:
    from placer.verify.realmodel import real_document, refit_real, render_real

    fb = refit_real(plan, profile, results) if options.refit and profile else None
    doc = real_document(str(plan_path), where, options.steps, results, plan, profile, fb)
    if out_path is not None:
        _write_json(out_path, doc)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        for line in render_real(doc):
            click.echo(line)
    if save_profile is not None and fb is not None:
        _write_profile(save_profile, fb.profile, "--save-profile")
        _say(f"wrote {save_profile}", as_json)
    if not any(r.status == "ok" for r in results):
        sys.exit(1)


def _real_on_slurm(plan_path: Path, plan: Plan, profile: LinkProfile | None,
                   options: VerifyOptions, client: SlurmClient, slurm: SlurmOptions,
                   work_dir: Path, where: str, out_path: Path | None,
                   save_profile: Path | None, as_json: bool) -> None:
    """``verify --slurm --real-model``: each candidate's model as a Slurm job; reruns resume."""
    from placer.verify.realmodel import real_line, run_real_slurm
    from placer.verify.session import top_indices

    def arrived(result: RealResult, resumed: bool) -> None:
        note = f" (results of an earlier run in {work_dir}, not re-run)" if resumed else ""
        _say(real_line(result) + note, as_json)

    results = run_real_slurm(plan, client, slurm, profile, top_indices(plan, options),
                             work_dir, options.steps, options.warmup_steps,
                             options.candidate_timeout_s, arrived)
    if any(r.status not in ("ok", "skipped") for r in results):
        _say(f"logs of the failed candidates are in {work_dir}/model*/logs; run the same "
             "command again to re-run only them", as_json)
    _finish_real(plan_path, plan, profile, options, where, results, out_path, save_profile,
                 as_json)


def _check_shapes(plan: Plan, options: VerifyOptions, emulate: str | None, nproc: int,
                  quiet_stdout: bool) -> None:
    """Before calibrating: one line per top candidate the ranks here cannot run; an error when
    none can (nothing would be measured)."""
    from placer.verify.emulate import parse_emulate_spec
    from placer.verify.session import shape_problems, top_indices

    if emulate is not None:
        nodes, gpus = parse_emulate_spec(emulate)
        where = f"--emulate {emulate}"
    else:
        nodes, gpus, where = 1, nproc, f"this machine's {nproc} ranks (--nproc)"
    problems = shape_problems(plan, options, nodes, gpus, where)
    for index, why in sorted(problems.items()):
        _say(f"candidate {index} cannot run here: {why}", quiet_stdout)
    if len(problems) == len(top_indices(plan, options)):
        raise PlacerError(f"{where}: none of the top {len(problems)} candidates fits "
                          f"{nodes} node(s) x {gpus} ranks; verify a plan made for this shape, "
                          "or check the plan on its own cluster with --slurm / --emit-config")


def _finish(doc: dict[str, object], results: list[CandidateResult], fb: Feedback | None,
            out_path: Path | None, save_profile: Path | None, as_json: bool) -> None:
    from placer.verify.output import render

    if out_path is not None:
        _write_json(out_path, doc)
    if save_profile is not None and fb is not None:
        _write_profile(save_profile, fb.profile, "--save-profile")
        _say(f"wrote {save_profile}", as_json)
    if as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        for line in render(doc):
            click.echo(line)
    if not any(r.status == "ok" for r in results):
        sys.exit(1)


def _emit_replays(plan_path: Path, plan: Plan, profile: LinkProfile | None,
                  options: VerifyOptions, out_dir: Path) -> None:
    """Write each candidate's replay for a real cluster and print how to run and compare it."""
    from placer.verify.runner import torchrun_hint
    from placer.verify.session import emit

    _make_folder(out_dir, "--emit-config")
    if profile is not None and not (out_dir / "profile.yaml").is_file():
        _write_profile(out_dir / "profile.yaml", profile, "--emit-config")
    for placement, config, results in emit(plan, profile, options, out_dir):
        nodes = placement.nodes
        argv = ["-m", "placer.verify.workers.replay", str(config.absolute()),
                str(results.absolute())]
        click.echo(f"candidate {placement.candidate_index} ({placement.layout.compact()}): on "
                   f"each node, after `source {config.parent / 'launch' / 'env.sh'}`:")
        click.echo("  " + torchrun_hint(len(nodes), nodes[0].num_ranks, argv))
    flags = f" --scale {options.scale:g}" if options.scale != 1.0 else ""
    click.echo(f"then: placer verify {plan_path} --from {out_dir}{flags} [--calibrate]")


def _short_fits(cal: CalibrationResult) -> list[str]:
    lines = []
    for f in cal.collectives:
        if f.in_profile and f.is_default:
            lines.append(f"calibrated {f.link_class}: latency {f.fit.latency_s * 1e6:.0f} us, "
                         f"bus bw {f.fit.bandwidth_bytes_per_s / 1e6:.1f} MB/s "
                         f"(fit error {f.fit.weighted_error:.0%})")
    if cal.gemm is not None:
        lines.append(f"calibrated GEMM: max efficiency {cal.gemm.profile.max_efficiency:.3f}")
    return lines


def _note_rate_mismatch(cluster: Cluster, emulate: str | None, mbit: float | None,
                        quiet_stdout: bool) -> None:
    if emulate is None or mbit is None:
        return
    rates = {nic.rate_gbps * 1000 for t in cluster.node_types for nic in t.nics}
    if rates and rates != {mbit}:
        _say(f"note: the plan's cluster has {sorted(rates)} Mbit/s NICs but the emulated links "
             f"run at {mbit:g} Mbit/s; predictions use the plan's cluster", quiet_stdout)


def _write_json(path: Path, doc: dict[str, object]) -> None:
    write_text(path, json.dumps(doc, indent=2) + "\n", "--out")


COMMANDS = [calibrate_command, verify_command]
