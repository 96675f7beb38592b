"""``placer verify --real-model``: each candidate trains its actual model for a few steps.

Beside the replay (which times the cost model's own account of a step), this runs the model
architecture itself with the plan's layout in plain PyTorch (placer/verify/workers/model.py):
random weights, random tokens, the plan's sizes. It measures what the replay cannot: whether
the candidate fits, i.e. its peak memory, next to the step time and tokens per second.

The prediction it is compared with is placer's memory model for the same model, layout and job,
as eager PyTorch runs it (``CostOptions(fused_kernels=False)``: separate projections, unfused
SwiGLU and fp32 cross-entropy, placer/cost/memory.py). On CPU the measurement is live tensor
bytes, so the prediction compared is the model's total less what only a GPU has (the CUDA
context and NCCL buffers, ``framework_bytes``, and the caching allocator's fragmentation); on
GPUs ``max_memory_allocated`` is compared with the same, and ``max_memory_reserved`` with the
total less ``framework_bytes``. With a profile whose memory terms ``placer calibrate
--real-model`` fitted (placer/verify/memory_fit.py), the prediction compared includes them; the
parts recorded are always the memory model's own, which is what a later fit starts from.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placer.cost import calibration_for, estimate
from placer.cost.memory import memory_estimate
from placer.cost.options import CostOptions
from placer.errors import PlacerError
from placer.launch import placement_of, write_launch_files
from placer.mesh import order_text, parse_order
from placer.spec.documents import (
    REAL_MODEL_FORMAT,
    VERIFY_REAL_MODEL_FORMAT,
    RealModelConfig,
    RealModelResults,
    document,
)
from placer.spec.layout import Layout
from placer.spec.model import Model
from placer.spec.profile import LinkProfile
from placer.spec.results import MemoryBreakdown, Plan
from placer.verify.feedback import Feedback, fit_compute_scale, overshooting_notes, scale_gemm
from placer.verify.fit import median
from placer.verify.memory_fit import MemoryPoint, fit_memory
from placer.verify.runner import Launcher
from placer.verify.session import check_shape, slots_of
from placer.verify.slurm import JobEnd, SlurmClient, SlurmJob, SlurmOptions, run_jobs

WORKER = Path(__file__).resolve().parent / "workers" / "model.py"
EAGER = CostOptions(fused_kernels=False)
SCHEDULES = ("1f1b", "interleaved", "gpipe")


def unsupported(model: Model, layout: Layout) -> str | None:
    """What of this candidate the real-model worker does not build, or None."""
    reasons = []
    if layout.sequence_parallel:
        reasons.append("sequence parallelism")
    if layout.zero_stage in (1, 2) and layout.zero_allowed:
        reasons.append(f"ZeRO-{layout.zero_stage} (it runs ZeRO-0 or FSDP2 ZeRO-3)")
    if layout.recompute != "none":
        reasons.append(f"recompute={layout.recompute}")
    if layout.etp > 1:
        reasons.append("expert tensor parallelism")
    if layout.pp > 1 and layout.pipeline_schedule not in SCHEDULES:
        reasons.append(f"schedule {layout.pipeline_schedule}")
    if layout.zero_stage >= 3 and layout.pp > 1:
        reasons.append("FSDP2 under pipelining")
    if model.moe is not None and (model.moe.num_shared_experts or layout.tp > 1):
        reasons.append("shared experts or TP with experts")
    if model.moe is not None and layout.zero_stage >= 3:
        reasons.append("FSDP2 with experts")
    if model.hidden_dropout or model.attention_dropout or model.sliding_window:
        reasons.append("dropout or sliding-window attention")
    if layout.cp > 1 and layout.tp > 1:
        reasons.append("CP with TP")
    if not reasons:
        return None
    return "the real-model mode does not build " + ", ".join(reasons)


def _round_to(value: float, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)


def scaled_plan(plan: Plan, scale: float) -> Plan:
    """The plan with its model narrowed by ``scale`` (CPU runs of a large model): hidden size,
    FFN and expert widths and vocabulary shrink, layers, heads, the layout and the job stay, so
    every parallel dimension still divides what it splits (multiples of every candidate's tp
    and ep, and of 8). Predictions are made for the scaled model, not the plan's."""
    if scale >= 1.0:
        return plan
    model = plan.model
    split = max(c.layout.tp * c.layout.etp for c in plan.candidates) * 8
    head_dim = _round_to(model.attention_head_dim * scale, 8)
    update: dict[str, Any] = {
        "hidden_size": head_dim * model.num_attention_heads, "head_dim": head_dim,
        "ffn_hidden_size": _round_to(model.ffn_hidden_size * scale, split),
        "vocab_size": _round_to(model.vocab_size * scale, split),
        "name": f"{model.name}-x{scale:g}"[:96]}
    data = {**model.model_dump(mode="json"), **update}
    if model.moe is not None:
        moe = model.moe
        data["moe"] = {**moe.model_dump(mode="json"),
                       "expert_ffn_hidden_size": _round_to(moe.expert_ffn_hidden_size * scale,
                                                           split)}
        if moe.shared_expert_ffn_hidden_size:
            data["moe"]["shared_expert_ffn_hidden_size"] = _round_to(
                moe.shared_expert_ffn_hidden_size * scale, split)
    return plan.model_copy(update={"model": Model.model_validate(data)})


def host_memory_problem(result: RealResult, world_size: int) -> str | None:
    """On CPU every rank lives in this machine's memory: refuse a run that would need more than
    half of what is available (MemAvailable, /proc/meminfo) rather than swap or be killed."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    available = next((int(line.split()[1]) * 1024 for line in text.splitlines()
                      if line.startswith("MemAvailable:")), None)
    need = (result.predicted_memory_bytes or 0) * world_size
    if available is None or need <= available / 2:
        return None
    return (f"its {world_size} ranks would need about {need / 2**30:.1f} GiB of this machine's "
            f"memory ({available / 2**30:.1f} GiB available); narrow the model with --scale")


def worker_config(plan: Plan, index: int, job_dir: Path, steps: int, warmup_steps: int,
                  timeout_s: float) -> dict[str, Any]:
    """What workers/model.py reads besides the rank map."""
    model, job = plan.model, plan.job
    layout = plan.candidates[index].layout
    return document(RealModelConfig, {
        "format": REAL_MODEL_FORMAT, "job_dir": str(job_dir), "backend": "auto",
        "timeout_s": max(60.0, timeout_s), "steps": steps, "warmup_steps": warmup_steps,
        "model": {
            "num_layers": model.num_layers, "hidden_size": model.hidden_size,
            "heads": model.num_attention_heads, "kv_heads": model.kv_heads,
            "head_dim": model.attention_head_dim, "ffn_hidden_size": model.ffn_hidden_size,
            "gated_mlp": model.gated_mlp, "vocab_size": model.vocab_size,
            "tied_embeddings": model.tied_embeddings,
            "moe": model.moe.model_dump(mode="json") if model.moe else None,
            "moe_layers": [i for i in range(model.num_layers) if model.is_moe_layer(i)],
        },
        "layout": layout.model_dump(mode="json"),
        "chunks": list(layout.pipeline_split(model.num_layers).chunks),
        "schedule": layout.pipeline_schedule,
        "seq_len": job.seq_len,
        "microbatches": layout.num_microbatches(job.global_batch_size),
        "tokens_per_step": job.global_batch_size * job.seq_len,
        "optimizer": job.optimizer.model_dump(mode="json"),
        # On CPU the live-bytes tracker stops at the planned GPU's memory, as the GPU would.
        "device_memory_bytes": placement_of(plan, index).nodes[0].node_type.gpu.memory_bytes,
    })


@dataclass(frozen=True)
class MemoryPrediction:
    """Placer's memory model for the run as eager PyTorch does it, and what to compare."""

    breakdown: MemoryBreakdown
    device: str

    @property
    def allocated_bytes(self) -> int:
        """The live-tensor part: everything but the CUDA context / NCCL and fragmentation."""
        b = self.breakdown
        return b.total_bytes - b.framework_bytes - b.fragmentation_bytes

    @property
    def reserved_bytes(self) -> int:
        b = self.breakdown
        return b.total_bytes - b.framework_bytes


def predict_memory(plan: Plan, index: int, device: str,
                   profile: LinkProfile | None = None) -> MemoryPrediction:
    layout = plan.candidates[index].layout
    return MemoryPrediction(memory_estimate(plan.model, plan.cluster, plan.job, layout, EAGER,
                                            profile), device)


def memory_point(row: dict[str, Any]) -> MemoryPoint | None:
    """A finished candidate of a results document as a point of the memory fit."""
    parts = row["predicted_memory_parts_bytes"]
    if row["status"] != "ok" or not row["peak_allocated_bytes"] or not parts:
        return None
    return MemoryPoint(
        f"candidate {row['index']} ({row['layout_text']})",
        parts["weights"] + parts["gradients"] + parts["optimizer"],
        parts["activations"] + parts["logits"] + parts["moe_buffers"],
        int(row["peak_allocated_bytes"]))


@dataclass
class RealResult:
    """One candidate's real-model run: what it measured against what placer predicted."""

    index: int
    layout_text: str
    mesh_order: str
    status: str  # ok, oom, timeout, failed, skipped
    predicted_step_s: float | None
    predicted_memory_bytes: int | None
    predicted_parts: dict[str, int] = field(default_factory=dict)
    measured_step_s: float | None = None
    measured_steps_s: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    predicted_compute_s: float = 0.0
    after_refit_step_s: float | None = None
    static_bytes: int | None = None  # the worst rank's weights and optimizer state
    worst_rank: int | None = None
    device: str = ""
    error: str | None = None
    wall_s: float = 0.0

    @property
    def memory_error(self) -> float | None:
        if self.peak_allocated_bytes is None or not self.predicted_memory_bytes:
            return None
        return (self.predicted_memory_bytes - self.peak_allocated_bytes) \
            / self.peak_allocated_bytes

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "index": self.index, "layout_text": self.layout_text, "mesh_order": self.mesh_order,
            "status": self.status, "device": self.device,
            "predicted_step_s": self.predicted_step_s, "measured_step_s": self.measured_step_s,
            "measured_steps_s": self.measured_steps_s, "tokens_per_s": self.tokens_per_s,
            "predicted_memory_bytes": self.predicted_memory_bytes,
            "predicted_memory_parts_bytes": self.predicted_parts,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "static_bytes": self.static_bytes, "worst_rank": self.worst_rank,
            "memory_relative_error": self.memory_error, "wall_s": self.wall_s,
            "predicted_compute_s": self.predicted_compute_s,
            "after_refit_predicted_step_s": self.after_refit_step_s}
        if self.error:
            doc["error"] = self.error
        return doc


def _base(plan: Plan, index: int, profile: LinkProfile | None, device: str) -> RealResult:
    cand = plan.candidates[index]
    placement = placement_of(plan, index)
    order = parse_order(cand.mesh_order)
    est = estimate(plan.model, plan.cluster, plan.job, cand.layout, order, slots_of(placement),
                   profile, EAGER)
    memory = predict_memory(plan, index, device, profile)
    b = predict_memory(plan, index, device).breakdown  # the model's own parts, for a later fit
    parts = {"weights": b.weights_bytes, "gradients": b.gradients_bytes,
             "optimizer": b.optimizer_bytes, "activations": b.activations_bytes,
             "logits": b.logits_bytes, "moe_buffers": b.moe_buffers_bytes}
    return RealResult(index, cand.layout.compact(), order_text(order), "skipped",
                      est.step_time_s, memory.allocated_bytes, parts, device=device,
                      predicted_compute_s=est.breakdown.compute_s + est.breakdown.recompute_s)


def collect_real(result: RealResult, out_dir: Path, world_size: int) -> RealResult:
    """Fold the ranks' records: slowest step, worst rank's peak memory, OOM anywhere."""
    records = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank*.json"))]
    if any(r.get("oom") for r in records):
        oom = next(r for r in records if r.get("oom"))
        result.status = "oom"
        result.error = f"out of memory on rank {oom['rank']}: {oom.get('error', '')}"
        result.peak_allocated_bytes = max(int(r.get("peak_allocated_bytes") or 0)
                                          for r in records)
        return result
    if len(records) != world_size:
        result.status = "failed"
        result.error = f"{len(records)} of {world_size} ranks wrote results in {out_dir}"
        return result
    steps = records[0]["step_max_s"]
    result.status = "ok"
    result.measured_steps_s = steps
    result.measured_step_s = median(steps)
    result.tokens_per_s = records[0]["tokens_per_step"] / result.measured_step_s
    worst = max(records, key=lambda r: int(r["peak_allocated_bytes"]))
    result.peak_allocated_bytes = int(worst["peak_allocated_bytes"])
    result.static_bytes = int(worst.get("static_bytes") or 0)
    result.worst_rank = int(worst["rank"])
    reserved = [r.get("peak_reserved_bytes") for r in records]
    result.peak_reserved_bytes = max(int(x) for x in reserved) if all(
        x is not None for x in reserved) else None
    result.device = records[0].get("device", result.device)
    return result


def write_real_candidate(plan: Plan, index: int, cand_dir: Path, steps: int,
                         warmup_steps: int, timeout_s: float) -> tuple[Path, Path]:
    """Launch files, model.json and an empty results folder; (config path, out dir)."""
    job_dir, out_dir = cand_dir / "launch", cand_dir / "out"
    write_launch_files(plan, index, job_dir, force=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.json"):
        stale.unlink()
    config = cand_dir / "model.json"
    config.write_text(json.dumps(worker_config(plan, index, job_dir.absolute(), steps,
                                               warmup_steps, timeout_s)))
    return config, out_dir


def real_finished(plan: Plan, index: int, cand_dir: Path, steps: int, warmup_steps: int,
                  timeout_s: float) -> bool:
    """An earlier run left complete results for the same model.json (a rerun resumes)."""
    try:
        ran = json.loads((cand_dir / "model.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    want = worker_config(plan, index, (cand_dir / "launch").absolute(), steps, warmup_steps,
                         timeout_s)
    if ran != json.loads(json.dumps(want)):
        return False
    records = list((cand_dir / "out").glob("rank*.json"))
    return len(records) == placement_of(plan, index).world_size


def run_real_slurm(plan: Plan, client: SlurmClient, slurm: SlurmOptions,
                   profile: LinkProfile | None, indices: list[int], work_dir: Path, steps: int,
                   warmup_steps: int, timeout_s: float,
                   on_result: Callable[[RealResult, bool], None] | None = None
                   ) -> list[RealResult]:
    """Each candidate's model as its own Slurm job (placer/verify/slurm.py); candidates with
    results from an earlier run are read back, not run again (``on_result(r, resumed)``)."""
    results: dict[int, RealResult] = {}
    jobs: list[SlurmJob] = []

    def done(result: RealResult, resumed: bool) -> None:
        results[result.index] = result
        if on_result is not None:
            on_result(result, resumed)

    for index in indices:
        cand_dir = work_dir / f"model{index}"
        result = _base(plan, index, profile, "")
        why = unsupported(plan.model, plan.candidates[index].layout)
        if why is not None:
            result.error = why
            done(result, False)
        elif real_finished(plan, index, cand_dir, steps, warmup_steps, timeout_s):
            done(collect_real(result, cand_dir / "out", placement_of(plan, index).world_size),
                 True)
        else:
            config, out_dir = write_real_candidate(plan, index, cand_dir, steps, warmup_steps,
                                                   timeout_s)
            (cand_dir / "logs").mkdir(exist_ok=True)
            jobs.append(SlurmJob(index, cand_dir / "launch", cand_dir / "slurm.json",
                                 cand_dir / "logs" / "slurm-%j.out",
                                 (str(config.absolute()), str(out_dir.absolute()))))

    def ended(job: SlurmJob) -> None:
        result = _base(plan, job.index, profile, "")
        if job.job_id is not None:
            job.log_path = Path(str(job.log_path).replace("%j", str(job.job_id)))
        if job.started is not None:
            result.wall_s = time.monotonic() - job.started
        result = collect_real(result, work_dir / f"model{job.index}" / "out",
                              placement_of(plan, job.index).world_size)
        if result.status != "oom" and (job.timed_out or job.end is None
                                       or job.end.state != "COMPLETED"):
            end = job.end or JobEnd("UNKNOWN")
            result.status = "timeout" if job.timed_out or end.state == "TIMEOUT" else "failed"
            result.error = (f"{result.status}: Slurm job {job.job_id} {end.state}"
                            f"{', exit code ' + end.exit_code if end.exit_code else ''}"
                            f"{' (' + end.reason + ')' if end.reason not in ('', 'None') else ''}"
                            f": {job.telling_line()}")
        done(result, False)

    run_jobs(client, jobs, WORKER, slurm, timeout_s, "auto", ended)
    return [results[i] for i in indices]


def run_real(plan: Plan, launcher: Launcher, profile: LinkProfile | None, indices: list[int],
             work_dir: Path, steps: int, warmup_steps: int, timeout_s: float,
             device: str = "cpu") -> list[RealResult]:
    """Run each candidate's model under ``launcher``; a hang, crash or OOM is that
    candidate's result and the next one runs."""
    results = []
    for index in indices:
        result = _base(plan, index, profile, device)
        layout = plan.candidates[index].layout
        why = unsupported(plan.model, layout)
        placement = placement_of(plan, index)
        if why is None:
            why = check_shape(placement, launcher.num_nodes, launcher.gpus_per_node,
                              launcher.description)
        if why is None and device == "cpu":
            why = host_memory_problem(result, placement.world_size)
        if why is not None:
            result.error = why
            results.append(result)
            continue
        cand_dir = work_dir / f"model{index}"
        config, out_dir = write_real_candidate(plan, index, cand_dir, steps, warmup_steps,
                                               timeout_s)
        run = launcher.run([str(WORKER), str(config), str(out_dir)], cand_dir / "logs",
                           timeout_s)
        result.wall_s = run.wall_s
        result = collect_real(result, out_dir, placement.world_size)
        if not run.ok and result.status != "oom":
            result.status = "timeout" if run.status == "timeout" else "failed"
            last = run.log_tail.splitlines()[-1] if run.log_tail else ""
            errors = [ln for ln in run.log_tail.splitlines() if "Error" in ln]
            result.error = f"{run.status}, exit codes {list(run.exit_codes)}: " \
                f"{(errors or [last])[-1]}"
        results.append(result)
    if not results:
        raise PlacerError("no candidate to run")
    return results


def refit_real(plan: Plan, profile: LinkProfile, results: list[RealResult]) -> Feedback:
    """The profile refitted from the measured step times, as ``verify --calibrate`` does with
    replays (placer/verify/feedback.py): the GEMM efficiency rescaled so the cost model's
    compute part explains them. Each candidate is re-predicted with it."""
    ok = [r for r in results if r.status == "ok" and r.measured_step_s
          and r.predicted_step_s is not None]
    steps = [(r.measured_step_s or 0.0, r.predicted_step_s or 0.0, r.predicted_compute_s)
             for r in ok]
    scale = fit_compute_scale(steps)
    skipped = overshooting_notes(steps, [r.index for r in ok])
    updated = profile
    if scale is None:
        skipped += ("compute: no usable step times to rescale the GEMM efficiency",)
    else:
        updated = scale_gemm(profile, scale)
    for r in ok:
        cand = plan.candidates[r.index]
        est = estimate(plan.model, plan.cluster, plan.job, cand.layout,
                       parse_order(cand.mesh_order), slots_of(placement_of(plan, r.index)),
                       updated, EAGER)
        r.after_refit_step_s = est.step_time_s
    points = [p for r in ok if (p := memory_point(r.document())) is not None]
    try:
        memory = fit_memory(points, ok[0].device or None if ok else None).profile
        updated = updated.model_copy(update={"memory": memory})
    except PlacerError as exc:
        skipped += (f"memory: {exc}",)
    before = profile.gemm.max_efficiency if profile.gemm else None
    after = updated.gemm.max_efficiency if updated.gemm else None
    return Feedback(updated, (), scale, before, after, skipped)


# ------------------------------------------------------------------ what verify prints

MIB = 2**20


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def real_line(r: RealResult) -> str:
    """One line per finished candidate."""
    head = f"candidate {r.index}: {r.layout_text} order {r.mesh_order}"
    if r.status != "ok" or r.measured_step_s is None:
        return f"{head}: {r.status.upper()}: {r.error}"
    line = f"{head}: step {r.measured_step_s:.3f} s"
    if r.predicted_step_s is not None:
        line += f" (predicted {r.predicted_step_s:.3f} s)"
    line += f", {r.tokens_per_s or 0:.0f} tokens/s, peak {_mib(r.peak_allocated_bytes)} MiB " \
        f"{'live' if r.device == 'cpu' else 'allocated'}"
    if r.memory_error is not None:
        line += f" (predicted {_mib(r.predicted_memory_bytes)} MiB, {r.memory_error:+.1%})"
    return line


def real_document(plan_source: str, launcher: str, steps: int, results: list[RealResult],
                  plan: Plan, profile: LinkProfile | None,
                  fb: Feedback | None = None) -> dict[str, Any]:
    """The --real-model results (validated by spec/documents.py's RealModelResults), with what
    the predictions used (the GPU, GEMM constants and profile) for ``calibrate --real-model``."""
    from placer.verify.output import feedback_document

    errors = [abs(e) for r in results if (e := r.memory_error) is not None and r.status == "ok"]
    calib = calibration_for(plan.cluster, profile)
    doc: dict[str, Any] = {
        "format": VERIFY_REAL_MODEL_FORMAT, "plan": plan_source, "launcher": launcher,
        "steps": steps, "compared_memory": (
            "CPU: live tensor bytes vs placer's total less framework and fragmentation; "
            "GPU: max_memory_allocated vs the same"),
        "gpu": calib.gpu.name, "gemm": calib.gemm.model_dump(mode="json"),
        "profile": None if profile is None else profile.model_dump(mode="json"),
        "candidates": [r.document() for r in results],
        "max_abs_memory_relative_error": max(errors) if errors else None}
    if fb is not None:
        doc["calibration"] = feedback_document(fb)
    return document(RealModelResults, doc)


def render_real(doc: dict[str, Any]) -> list[str]:
    lines = [f"{'#':>2}  {'status':8s} {'step s':>8s} {'pred s':>8s} {'tokens/s':>9s} "
             f"{'peak MiB':>9s} {'pred MiB':>9s} {'error':>7s}  layout"]
    for c in doc["candidates"]:
        err = c["memory_relative_error"]
        step = c["measured_step_s"]
        pred = c["predicted_step_s"]
        tps = c["tokens_per_s"]
        lines.append(
            f"{c['index']:>2}  {c['status']:8s} {'-' if step is None else f'{step:.3f}':>8s} "
            f"{'-' if pred is None else f'{pred:.3f}':>8s} "
            f"{'-' if tps is None else f'{tps:.0f}':>9s} "
            f"{_mib(c['peak_allocated_bytes']):>9s} {_mib(c['predicted_memory_bytes']):>9s} "
            f"{'-' if err is None else f'{err:+.1%}':>7s}  {c['layout_text']}")
    worst = doc["max_abs_memory_relative_error"]
    if worst is not None:
        lines.append(f"peak memory: predicted within {worst:.1%} of measured for every "
                     "candidate that ran")
    calibration = doc.get("calibration")
    if calibration is not None:
        scale, gemm = calibration["compute_scale"], calibration["gemm_max_efficiency"]
        if scale is not None and gemm["before"] is not None:
            lines.append(f"refit compute: step times fit with compute x {scale:.2f}, GEMM max "
                         f"efficiency {gemm['before']:.3f} -> {gemm['after']:.3f}")
        for c in doc["candidates"]:
            after, step = c["after_refit_predicted_step_s"], c["measured_step_s"]
            if after is not None and step:
                lines.append(f"  candidate {c['index']}: predicted {after:.3f} s after the "
                             f"refit ({(after - step) / step:+.0%})")
        memory = calibration["profile"].get("memory")
        if memory is not None:
            lines.append(f"refit memory: peaks fit with dynamic memory x "
                         f"{memory['activation_scale']:.3f} + "
                         f"{memory['overhead_bytes'] / MIB:.2f} MiB per rank "
                         f"({memory['fitted_candidates']} candidates)")
        for note in calibration["left_out"]:
            lines.append(f"  left out of the refit: {note}")
    return lines
