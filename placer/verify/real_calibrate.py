"""``placer calibrate --real-model RESULTS.json``: a profile from real-model measurements.

``verify --real-model --out`` records, per candidate, the memory model's own parts, the measured
peak, the predicted and measured step time and the compute on the critical stage, and, once,
the GPU, GEMM constants and profile the predictions used. From one or more such files (one GPU
type, one device kind) this fits, over every finished candidate at once:

* the memory terms (placer/verify/memory_fit.py): dynamic-memory scale and per-rank overhead;
* the compute scale, exactly as ``verify --calibrate`` does with replay step times
  (feedback.fit_compute_scale): the GEMM efficiency the predictions used, divided by it.

They go into the base profile (``--profile``, else the one the runs were predicted with, else
one holding only these terms).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from placer.errors import InputError, PlacerError, from_validation_error
from placer.spec.documents import VERIFY_REAL_MODEL_FORMAT, RealModelResults
from placer.spec.profile import GemmProfile, LinkProfile
from placer.verify.feedback import fit_compute_scale, overshooting_notes
from placer.verify.memory_fit import MemoryFit, fit_memory, rms_error
from placer.verify.realmodel import memory_point

MIB = 2**20


@dataclass(frozen=True)
class RealCalibration:
    """The profile and the fits behind it."""

    profile: LinkProfile
    memory: MemoryFit
    compute_scale: float | None
    gemm_before: float
    gemm_after: float | None
    sources: tuple[str, ...]
    left_out: tuple[str, ...] = ()
    """Candidates the compute fit leaves out (feedback.overshooting_notes)."""


def load_real_results(path: Path) -> dict[str, Any]:
    """A ``verify --real-model --out`` file, validated."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlacerError(f"{path}: cannot read real-model results ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != VERIFY_REAL_MODEL_FORMAT:
        raise InputError("--real-model", str(path), f"not a {VERIFY_REAL_MODEL_FORMAT} file; "
                         "pass what 'placer verify --real-model --out FILE' wrote")
    try:
        RealModelResults.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, str(path), schema="verify-real-model") from None
    return data


def _one(docs: Sequence[tuple[str, dict[str, Any]]], what: str, key: Any) -> Any:
    values = {json.dumps(key(doc), sort_keys=True): (source, key(doc)) for source, doc in docs}
    if len(values) > 1:
        (a, va), (b, vb) = list(values.values())[:2]
        raise InputError("--real-model", f"{a}, {b}", f"they differ in {what} ({va} vs {vb}); "
                         "fit runs of one GPU type and one set of constants at a time")
    return next(iter(values.values()))[1]


def _devices(docs: Sequence[tuple[str, dict[str, Any]]]) -> str | None:
    devices = {c["device"] for _, doc in docs for c in doc["candidates"]
               if c["status"] == "ok" and c["device"]}
    if len(devices) > 1:
        raise InputError("--real-model", ", ".join(sorted(devices)), "the results mix devices "
                         "(live bytes on CPU, the CUDA allocator on GPUs); fit each apart")
    return next(iter(devices), None)


def calibrate_real(docs: Sequence[tuple[str, dict[str, Any]]], base: LinkProfile | None
                   ) -> RealCalibration:
    """Fit memory and compute terms over every finished candidate of ``docs``."""
    gpu = _one(docs, "the GPU the plan was made for", lambda d: d["gpu"])
    gemm = GemmProfile.model_validate(_one(docs, "the GEMM constants of the predictions",
                                           lambda d: d["gemm"]))
    device = _devices(docs)
    rows = [row for _, doc in docs for row in doc["candidates"]]
    points = [p for row in rows if (p := memory_point(row)) is not None]
    memory = fit_memory(points, device)
    fitted = [row for row in rows if row["status"] == "ok" and row["measured_step_s"]
              and row["predicted_step_s"] is not None]
    steps = [(row["measured_step_s"], row["predicted_step_s"], row["predicted_compute_s"])
             for row in fitted]
    scale = fit_compute_scale(steps)
    left_out = overshooting_notes(steps, [row["index"] for row in fitted])
    if base is None:
        recorded = _one(docs, "the profile of the predictions", lambda d: d["profile"])
        base = (LinkProfile.model_validate(recorded) if recorded is not None
                else LinkProfile(gpu=gpu))
    update: dict[str, Any] = {"memory": memory.profile}
    after = None
    if scale is not None:  # as feedback.scale_gemm: the efficiency the predictions used / scale
        after = min(1.0, gemm.max_efficiency / scale)
        update["gemm"] = (base.gemm or gemm).model_copy(update={"max_efficiency": after})
    profile = LinkProfile.model_validate(base.model_copy(update=update).model_dump())
    return RealCalibration(profile, memory, scale, gemm.max_efficiency, after,
                           tuple(source for source, _ in docs), left_out)


def real_report_lines(cal: RealCalibration) -> list[str]:
    """What was fitted, and each candidate's peak before and after."""
    m = cal.memory
    lines = [f"real-model measurements: {', '.join(cal.sources)}",
             f"memory     peak = static + {m.profile.activation_scale:.3f} x dynamic + "
             f"{m.profile.overhead_bytes / MIB:.2f} MiB ({m.freed} fitted over "
             f"{len(m.points)} candidates): rms error {rms_error(m, False):.1%} -> "
             f"{rms_error(m, True):.1%}"]
    for point, before, after in zip(m.points, m.errors(False), m.errors(True), strict=True):
        lines.append(f"    {point.label}: measured {point.measured_bytes / MIB:.1f} MiB, "
                     f"predicted {before:+.1%} -> {after:+.1%}")
    if cal.compute_scale is None:
        lines.append("compute    no usable step times: GEMM efficiency left as it was")
    else:
        lines.append(f"compute    step times fit with compute x {cal.compute_scale:.3f}: GEMM "
                     f"max efficiency {cal.gemm_before:.4g} -> {cal.gemm_after:.4g}")
        if cal.gemm_after is not None and cal.gemm_after >= 1.0:
            lines.append("    capped at 1: the steps ran faster than the GPU peak the plan "
                         "assumes allows; measure the GEMMs first (placer calibrate) and verify "
                         "with --profile")
    lines += [f"    {note}" for note in cal.left_out]
    return lines
