"""``placer verify``: replay the top candidates of a plan, compare with the prediction, learn.

For each candidate: write its launch files (the same ``placer launch`` writes), build the replay
program at ``scale`` and its predicted time (placer/verify/replay.py), run it under the launcher
with a time limit, and read back the measured step times and op times. A hang or crash is
reported for that candidate and the next one runs. Then: Kendall's tau between predicted and
measured step times, whether the predicted best was the measured best and, with ``refit``, the
same after refitting the profile from the measurements (placer/verify/feedback.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from placer.cost import calibration_for, estimate
from placer.cost.groups import GroupLinks, group_links
from placer.cost.profile import Calibration
from placer.dims import Part
from placer.errors import PlacerError
from placer.launch import placement_of, write_launch_files
from placer.launch.rankmap import PlacedCandidate
from placer.mesh import order_text, parse_order
from placer.spec.documents import ReplayConfig, document
from placer.spec.profile import LinkProfile
from placer.spec.results import Estimate, Plan
from placer.topology import topology_of
from placer.verify.feedback import (
    Feedback,
    OpSample,
    fit_compute_scale,
    overshooting_notes,
    refit_collectives,
    scale_gemm,
)
from placer.verify.fit import kendall_tau, median
from placer.verify.replay import (
    ReplayProgram,
    build_program,
    choose_gemm_n,
    repredict,
    smallest_part_s,
)
from placer.verify.runner import Launcher
from placer.verify.slurm import JobEnd, SlurmClient, SlurmJob, SlurmOptions, run_jobs

WORKER = Path(__file__).resolve().parent / "workers" / "replay.py"
Status = Literal["ok", "timeout", "failed", "skipped"]


@dataclass(frozen=True)
class VerifyOptions:
    top_k: int = 3
    scale: float = 1.0
    steps: int = 5
    warmup_steps: int = 1
    candidate_timeout_s: float = 180.0
    refit: bool = False


@dataclass(frozen=True)
class Prepared:
    """A candidate resolved against the cost model: placement, estimate, links, program."""

    index: int
    placement: PlacedCandidate
    estimate: Estimate
    links: GroupLinks
    calib: Calibration
    program: ReplayProgram


@dataclass
class CandidateResult:
    index: int
    layout: dict[str, Any]
    layout_text: str
    mesh_order: str
    status: Status
    predicted_step_s: float | None
    estimate_step_s: float | None
    plan_step_s: float
    predicted_parts: dict[str, float]
    measured_step_s: float | None = None
    measured_steps_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    op_measured_s: dict[int, float] = field(default_factory=dict)
    gemm_call_measured_s: float | None = None
    gemm_n: int = 0
    gemm_call_predicted_s: float = 0.0
    after: dict[str, Any] | None = None

    @property
    def relative_error(self) -> float | None:
        if self.measured_step_s is None or self.predicted_step_s is None:
            return None
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "index": self.index, "layout": self.layout, "layout_text": self.layout_text,
            "mesh_order": self.mesh_order, "status": self.status,
            "predicted_step_s": self.predicted_step_s, "measured_step_s": self.measured_step_s,
            "relative_error": self.relative_error, "measured_steps_s": self.measured_steps_s,
            "estimate_step_s": self.estimate_step_s, "plan_step_s": self.plan_step_s,
            "predicted_parts_s": self.predicted_parts, "wall_s": self.wall_s,
            "gemm_stand_in": {"n": self.gemm_n, "predicted_call_s": self.gemm_call_predicted_s,
                              "measured_call_s": self.gemm_call_measured_s},
        }
        if self.error:
            doc["error"] = self.error
        if self.after is not None:
            doc["after_calibration"] = self.after
        return doc


# ------------------------------------------------------------------ preparing


def slots_of(placement: PlacedCandidate) -> list[int]:
    """GPU slot (the cost model's placement) of every logical index of the candidate's grid."""
    topo = topology_of(placement.plan.cluster)
    slots = [0] * placement.world_size
    for slot in placement.slots:
        node = placement.nodes[slot.node]
        slots[slot.logical] = topo.slot_of(node.cluster_node, slot.gpu)
    return slots


def check_shape(placement: PlacedCandidate, num_nodes: int, gpus_per_node: int, where: str
                ) -> str | None:
    """Why ``where`` (``num_nodes`` x ``gpus_per_node`` ranks) cannot run this candidate."""
    per_node = [node.num_ranks for node in placement.nodes]
    want = [gpus_per_node] * num_nodes
    if per_node != want:
        return (f"the candidate runs {len(per_node)} node(s) x "
                f"{'+'.join(map(str, sorted(set(per_node))))} ranks ({sum(per_node)} in all), "
                f"but {where} has {num_nodes} x {gpus_per_node}")
    return None


def shape_problems(plan: Plan, options: VerifyOptions, num_nodes: int, gpus_per_node: int,
                   where: str) -> dict[int, str]:
    """Top candidates that cannot run on ``where``, and why; checked before any calibration
    (a plan for 128 GPUs has nothing to learn from a 2 x 2 emulation)."""
    problems = {}
    for index in top_indices(plan, options):
        why = check_shape(placement_of(plan, index), num_nodes, gpus_per_node, where)
        if why is not None:
            problems[index] = why
    return problems


def top_indices(plan: Plan, options: VerifyOptions) -> list[int]:
    if not plan.candidates:
        raise PlacerError("the plan has no candidates; run recommend-layout again")
    return list(range(min(options.top_k, len(plan.candidates))))


def emit(plan: Plan, profile: LinkProfile | None, options: VerifyOptions, out_dir: Path
         ) -> list[tuple[PlacedCandidate, Path, Path]]:
    """Write every top candidate's launch files and replay program for a real cluster."""
    out = []
    for prep in prepare(plan, top_indices(plan, options), profile, options.scale):
        config_path, results = write_candidate(prep, plan, options, out_dir, "auto")
        out.append((prep.placement, config_path, results))
    return out


def prepare(plan: Plan, indices: Sequence[int], profile: LinkProfile | None, scale: float
            ) -> list[Prepared]:
    """Resolve each candidate and build its replay; one GEMM size for all (comparable)."""
    base = []
    for index in indices:
        placement = placement_of(plan, index)
        order = parse_order(plan.candidates[index].mesh_order)
        slots = slots_of(placement)
        est = estimate(plan.model, plan.cluster, plan.job, placement.layout, order, slots,
                       profile)
        links = group_links(plan.cluster, placement.layout, order, slots)
        base.append((index, placement, est, links, calibration_for(plan.cluster, profile)))
    pieces = [smallest_part_s(est, plan.model, plan.job, scale) for _, _, est, _, _ in base]
    gemm_n = choose_gemm_n(min((p for p in pieces if p > 0), default=0.0), base[0][4],
                           plan.job.precision)
    return [Prepared(index, placement, est, links, calib,
                     build_program(est, plan.model, plan.job, links, calib, scale, gemm_n))
            for index, placement, est, links, calib in base]


# ------------------------------------------------------------------ running


def replay_config(prep: Prepared, job_dir: Path, options: VerifyOptions, backend: str
                  ) -> dict[str, Any]:
    return document(ReplayConfig, {
        **prep.program.document(), "job_dir": str(job_dir), "backend": backend,
        "timeout_s": max(60.0, options.candidate_timeout_s),
        "warmup_steps": options.warmup_steps, "steps": options.steps})


def _base_result(prep: Prepared, plan: Plan) -> CandidateResult:
    cand = plan.candidates[prep.index]
    return CandidateResult(
        index=prep.index, layout=cand.layout.model_dump(mode="json"),
        layout_text=cand.layout.compact(), mesh_order=order_text(parse_order(cand.mesh_order)),
        status="skipped", predicted_step_s=prep.program.predicted_step_s,
        estimate_step_s=prep.estimate.step_time_s, plan_step_s=cand.step_time_s,
        predicted_parts=dict(prep.program.predicted_parts), gemm_n=prep.program.gemm_n,
        gemm_call_predicted_s=prep.program.gemm_call_s)


def write_candidate(prep: Prepared, plan: Plan, options: VerifyOptions, work_dir: Path,
                    backend: str) -> tuple[Path, Path]:
    """Launch files, replay program and an empty results folder; (config path, out dir)."""
    cand_dir = work_dir / f"candidate{prep.index}"
    job_dir, out_dir = cand_dir / "launch", cand_dir / "out"
    write_launch_files(plan, prep.index, job_dir, force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.json"):
        stale.unlink()
    config_path = cand_dir / "replay.json"
    config_path.write_text(json.dumps(replay_config(prep, job_dir.absolute(), options, backend)))
    return config_path, out_dir


def skipped_result(plan: Plan, index: int, why: str) -> CandidateResult:
    """A candidate that cannot run where verify runs: no replay built, so no prediction of one
    (the plan's own step time stays in ``plan_step_s``)."""
    cand = plan.candidates[index]
    return CandidateResult(
        index=index, layout=cand.layout.model_dump(mode="json"),
        layout_text=cand.layout.compact(), mesh_order=order_text(parse_order(cand.mesh_order)),
        status="skipped", predicted_step_s=None, estimate_step_s=None,
        plan_step_s=cand.step_time_s, predicted_parts={}, error=why)


def run_candidate(launcher: Launcher, prep: Prepared, plan: Plan, options: VerifyOptions,
                  work_dir: Path) -> CandidateResult:
    result = _base_result(prep, plan)
    config_path, out_dir = write_candidate(prep, plan, options, work_dir, launcher.backend)
    run = launcher.run([str(WORKER), str(config_path), str(out_dir)],
                       config_path.parent / "logs", options.candidate_timeout_s)
    result.wall_s = run.wall_s
    if not run.ok:
        result.status = "timeout" if run.status == "timeout" else "failed"
        limit = f" (limit {options.candidate_timeout_s:g} s)" if run.status == "timeout" else ""
        last = run.log_tail.splitlines()[-1] if run.log_tail else ""
        result.error = f"{run.status}{limit}, exit codes {list(run.exit_codes)}: {last}"
        return result
    return collect(prep, plan, out_dir, result)


def _check_emitted(prep: Prepared, config_path: Path) -> None:
    """The program that ran must be the one predicted (same profile, scale and plan)."""
    try:
        ran = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlacerError(f"--from: cannot read {config_path} ({exc})") from None
    expected = prep.program.document()
    if any(ran.get(key) != json.loads(json.dumps(value)) for key, value in expected.items()):
        raise PlacerError(f"--from: {config_path} was written for another plan, profile or "
                          "--scale; pass the --profile and --scale used with --emit-config")


def collect(prep: Prepared, plan: Plan, out_dir: Path,
            result: CandidateResult | None = None) -> CandidateResult:
    """Read the replay's per-rank results (written by a run here or on a real cluster)."""
    result = result or _base_result(prep, plan)
    records = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]
    if len(records) != prep.placement.world_size:
        result.status = "failed"
        result.error = (f"{len(records)} of {prep.placement.world_size} ranks wrote results "
                        f"in {out_dir}")
        return result
    steps = records[0]["step_max_s"]
    result.status = "ok"
    result.measured_steps_s = steps
    result.measured_step_s = median(steps)
    result.op_measured_s = op_times(prep, records)
    result.gemm_call_measured_s = gemm_call_time(records)
    return result


def op_times(prep: Prepared, records: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Per op kind, the median over calls of the fastest member's duration in each group.

    A collective ends together on every member, so the last to arrive waited least: its
    duration is the op's own time, free of the skew that the others' include.
    """
    by_rank = {int(r["rank"]): r for r in records}
    groups = prep.placement.groups
    out: dict[int, float] = {}
    for kind in prep.program.kinds:
        if kind.dimension == Part.PP:
            continue
        samples: list[float] = []
        for members in groups[kind.group]:
            per_rank = [by_rank[r]["ops"][str(kind.id)] for r in members]
            for step in range(len(per_rank[0])):
                for call in range(len(per_rank[0][step])):
                    samples.append(min(rec[step][call] for rec in per_rank))
        if samples:
            out[kind.id] = median(samples)
    return out


def gemm_call_time(records: Sequence[dict[str, Any]]) -> float | None:
    """Slowest rank's median per-call GEMM time (for the report; the refit uses step times)."""
    per_rank = [median([s / r["gemm_calls"] for s in r["gemm_s"]])
                for r in records if r.get("gemm_calls")]
    return max(per_rank) if per_rank else None


# ------------------------------------------------------------------ comparing


def ranking_summary(results: Sequence[CandidateResult], predicted: Callable[
        [CandidateResult], float]) -> dict[str, Any]:
    ok = [r for r in results if r.status == "ok" and r.measured_step_s is not None]
    if not ok:
        return {"kendall_tau": None, "predicted_best_is_measured_best": None,
                "max_abs_relative_error": None}
    pred = [predicted(r) for r in ok]
    meas = [r.measured_step_s for r in ok if r.measured_step_s is not None]
    best_pred = ok[min(range(len(ok)), key=lambda i: (pred[i], ok[i].index))].index
    best_meas = ok[min(range(len(ok)), key=lambda i: (meas[i], ok[i].index))].index
    errors = [abs(p - m) / m for p, m in zip(pred, meas, strict=True)]
    return {"kendall_tau": kendall_tau(pred, meas), "predicted_best": best_pred,
            "measured_best": best_meas, "predicted_best_is_measured_best": best_pred == best_meas,
            "max_abs_relative_error": max(errors),
            "median_abs_relative_error": median(errors)}


def op_samples(preps: Sequence[Prepared], results: Sequence[CandidateResult]
               ) -> list[OpSample]:
    by_index = {p.index: p for p in preps}
    ops: list[OpSample] = []
    for r in results:
        if r.status != "ok":
            continue
        prog = by_index[r.index].program
        for kind, link in zip(prog.kinds, prog.kind_links, strict=True):
            if kind.id in r.op_measured_s:
                ops.append(OpSample(r.index, kind.collective, kind.dimension, kind.message_bytes,
                                    kind.group_size, link, r.op_measured_s[kind.id]))
    return ops


def refit(plan: Plan, profile: LinkProfile, preps: Sequence[Prepared],
          results: Sequence[CandidateResult], use: Callable[[int], bool] = lambda _: True
          ) -> Feedback:
    """Refit from the candidates ``use`` selects: collectives from their op times, then the
    compute scale from their step times (placer/verify/feedback.py)."""
    chosen = [r for r in results if r.status == "ok" and use(r.index)]
    updated, refits, skipped = refit_collectives(profile, op_samples(preps, chosen))
    calib = calibration_for(plan.cluster, updated)
    by_index = {p.index: p for p in preps}
    steps, indices = [], []
    for r in chosen:
        step, parts = repredict(by_index[r.index].program, calib, plan.job.precision)
        if r.measured_step_s:
            steps.append((r.measured_step_s, step, parts.get("compute", 0.0)))
            indices.append(r.index)
    scale = fit_compute_scale(steps)
    skipped = (*skipped, *overshooting_notes(steps, indices))
    if scale is None:
        skipped = (*skipped, "compute: no usable step times to rescale the GEMM efficiency")
    else:
        updated = scale_gemm(updated, scale)
    before = profile.gemm.max_efficiency if profile.gemm else None
    after = updated.gemm.max_efficiency if updated.gemm else None
    return Feedback(updated, refits, scale, before, after, skipped)


def feedback(plan: Plan, profile: LinkProfile, preps: Sequence[Prepared],
             results: list[CandidateResult]) -> tuple[Feedback, dict[str, Any]]:
    """Refit from every replay, re-predict each candidate; also leave-one-out predictions."""
    fb = refit(plan, profile, preps, results)
    calib = calibration_for(plan.cluster, fb.profile)
    by_index = {p.index: p for p in preps}
    ok = [r for r in results if r.status == "ok"]
    before = {r.index: r.predicted_step_s or 0.0 for r in ok}
    for r in results:
        if r.index not in by_index:
            continue  # skipped: nothing was built for it
        prog = by_index[r.index].program
        step, parts = repredict(prog, calib, plan.job.precision)
        r.after = {"predicted_step_s": step, "predicted_parts_s": parts}
        if r.measured_step_s is not None:
            r.after["relative_error"] = (step - r.measured_step_s) / r.measured_step_s
        if r.status == "ok" and len(ok) > 1:
            loo = refit(plan, profile, preps, results, lambda i, me=r.index: i != me)
            loo_step, _ = repredict(prog, calibration_for(plan.cluster, loo.profile),
                                    plan.job.precision)
            r.after["leave_one_out_predicted_step_s"] = loo_step
    summary = ranking_summary(results, lambda r: r.after["predicted_step_s"] if r.after else 0.0)
    after_pred = [r.after["predicted_step_s"] for r in ok if r.after]
    summary["ranking_change_tau"] = kendall_tau([before[r.index] for r in ok], after_pred)
    summary["order_before"] = [r.index for r in sorted(ok, key=lambda r: (before[r.index],
                                                                          r.index))]
    summary["order_after"] = [r.index for r in sorted(
        ok, key=lambda r: (r.after["predicted_step_s"] if r.after else 0.0, r.index))]
    loo_errors = [abs(r.after["leave_one_out_predicted_step_s"] - r.measured_step_s)
                  / r.measured_step_s for r in ok
                  if r.after and "leave_one_out_predicted_step_s" in r.after
                  and r.measured_step_s]
    summary["leave_one_out_max_abs_relative_error"] = max(loo_errors) if loo_errors else None
    return fb, summary


def verify_plan(plan: Plan, launcher: Launcher | None, profile: LinkProfile | None,
                options: VerifyOptions, work_dir: Path,
                on_result: Callable[[CandidateResult, list[CandidateResult]], None] | None = None
                ) -> tuple[list[CandidateResult], dict[str, Any], Feedback | None]:
    """Run the top ``options.top_k`` candidates; results reach ``on_result`` as they arrive.

    Without a launcher, the replays already ran elsewhere (``verify --emit-config`` on a real
    cluster) and their results are read from ``work_dir``.
    """
    skipped = {} if launcher is None else shape_problems(
        plan, options, launcher.num_nodes, launcher.gpus_per_node, launcher.description)
    runnable = [i for i in top_indices(plan, options) if i not in skipped]
    preps = prepare(plan, runnable, profile, options.scale) if runnable else []
    results = [skipped_result(plan, i, why) for i, why in sorted(skipped.items())]
    for prep in preps:
        if launcher is None:
            _check_emitted(prep, work_dir / f"candidate{prep.index}" / "replay.json")
            result = collect(prep, plan, work_dir / f"candidate{prep.index}" / "out")
        else:
            result = run_candidate(launcher, prep, plan, options, work_dir)
        results.append(result)
        results.sort(key=lambda r: r.index)
        if on_result is not None:
            on_result(result, results)
    return compare(plan, profile, preps, results, options)


def compare(plan: Plan, profile: LinkProfile | None, preps: Sequence[Prepared],
            results: list[CandidateResult], options: VerifyOptions
            ) -> tuple[list[CandidateResult], dict[str, Any], Feedback | None]:
    """Ranking of measured against predicted and, with ``options.refit``, the refit."""
    summary = ranking_summary(results, lambda r: r.predicted_step_s or 0.0)
    fb = None
    if options.refit:
        if profile is None:
            raise PlacerError("--calibrate needs a link profile to refit (give --profile, or "
                              "let verify calibrate first)")
        fb, summary["after_calibration"] = feedback(plan, profile, preps, results)
    return results, summary, fb


# ------------------------------------------------------------------ Slurm


def finished(prep: Prepared, work_dir: Path) -> bool:
    """Whether an earlier run left this candidate's complete results for the same program."""
    cand_dir = work_dir / f"candidate{prep.index}"
    try:
        ran = json.loads((cand_dir / "replay.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    expected = json.loads(json.dumps(prep.program.document()))
    if any(ran.get(key) != value for key, value in expected.items()):
        return False
    return len(list((cand_dir / "out").glob("rank*.json"))) == prep.placement.world_size


def slurm_outcome(job: SlurmJob, result: CandidateResult, timeout_s: float) -> CandidateResult:
    """A non-COMPLETED job as a timeout or failure, with Slurm's words and the log's end."""
    end = job.end or JobEnd("UNKNOWN")
    if job.timed_out or end.state in ("TIMEOUT", "DEADLINE"):
        result.status = "timeout"
        head = f"timeout (limit {timeout_s:g} s): Slurm job {job.job_id} {end.state}"
    else:
        result.status = "failed"
        where = f"Slurm job {job.job_id}" if job.job_id is not None else "sbatch"
        head = f"failed: {where} {end.state}"
        if end.exit_code:
            head += f", exit code {end.exit_code}"
    if end.reason and end.reason != "None":
        head += f" ({end.reason})"
    line = job.telling_line()
    result.error = head + (f": {line}" if line else "")
    return result


def verify_plan_slurm(plan: Plan, client: SlurmClient, slurm: SlurmOptions,
                      profile: LinkProfile | None, options: VerifyOptions, work_dir: Path,
                      on_result: Callable[[CandidateResult, list[CandidateResult]], None]
                      | None = None, resumed: Callable[[CandidateResult], None] | None = None
                      ) -> tuple[list[CandidateResult], dict[str, Any], Feedback | None]:
    """Each top candidate as its own Slurm job (placer/verify/slurm.py); results as they end.

    Candidates whose results an earlier run in ``work_dir`` left for the same program are read
    back, not run again (``resumed`` hears of each).
    """
    preps = prepare(plan, top_indices(plan, options), profile, options.scale)
    by_index = {p.index: p for p in preps}
    results: dict[int, CandidateResult] = {}
    jobs: list[SlurmJob] = []
    for prep in preps:
        cand_dir = work_dir / f"candidate{prep.index}"
        if finished(prep, work_dir):
            result = collect(prep, plan, cand_dir / "out")
            results[prep.index] = result
            if resumed is not None:
                resumed(result)
            continue
        config_path, out_dir = write_candidate(prep, plan, options, work_dir, "auto")
        log_dir = cand_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        jobs.append(SlurmJob(prep.index, cand_dir / "launch", cand_dir / "slurm.json",
                             log_dir / "slurm-%j.out",
                             (str(config_path.absolute()), str(out_dir.absolute()))))

    def ended(job: SlurmJob) -> None:
        prep = by_index[job.index]
        result = _base_result(prep, plan)
        if job.job_id is not None:
            job.log_path = Path(str(job.log_path).replace("%j", str(job.job_id)))
        if job.started is not None:
            result.wall_s = time.monotonic() - job.started
        if job.end is not None and job.end.state == "COMPLETED" and not job.timed_out:
            result = collect(prep, plan, work_dir / f"candidate{job.index}" / "out", result)
        else:
            result = slurm_outcome(job, result, options.candidate_timeout_s)
        results[job.index] = result
        if on_result is not None:
            on_result(result, [results[i] for i in sorted(results)])

    run_jobs(client, jobs, WORKER, slurm, options.candidate_timeout_s, "auto", ended)
    return compare(plan, profile, preps, [results[p.index] for p in preps], options)
