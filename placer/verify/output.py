"""What ``placer verify`` prints and writes: one line per candidate as it finishes, a table, and
the JSON document (``--json``/``--out``), built from the same data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from placer.spec.documents import VERIFY_FORMAT, VerifyResults, document
from placer.verify.calibrate import profile_document
from placer.verify.feedback import Feedback
from placer.verify.session import CandidateResult, VerifyOptions

RESULTS_FORMAT = VERIFY_FORMAT


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0%}"


def short_layout(layout: dict[str, Any]) -> str:
    """tp, pp, dp and mbs always; the other knobs only where they differ from the default."""
    parts = [f"tp={layout['tp']}", f"pp={layout['pp']}", f"dp={layout['dp']}"]
    for key, default in (("cp", 1), ("ep", 1), ("etp", 1), ("vpp", 1)):
        if layout[key] != default:
            parts.append(f"{key}={layout[key]}")
    parts.append(f"mbs={layout['micro_batch_size']}")
    if layout["zero_stage"]:
        parts.append(f"zero={layout['zero_stage']}")
    if layout["recompute"] != "none":
        parts.append(f"recompute={layout['recompute']}")
    if layout["sequence_parallel"]:
        parts.append("sp=on")
    return ",".join(parts)


def candidate_line(r: CandidateResult) -> str:
    """One line per finished candidate (printed as results arrive)."""
    head = f"candidate {r.index}: {short_layout(r.layout)} order {r.mesh_order}"
    if r.status != "ok":
        return f"{head}: {r.status.upper()}: {r.error}"
    return (f"{head}: measured {_s(r.measured_step_s)} s, predicted {_s(r.predicted_step_s)} s "
            f"({_pct(r.relative_error)}), {r.wall_s:.0f} s wall")


def feedback_document(fb: Feedback) -> dict[str, Any]:
    return {
        "profile": profile_document(fb.profile),
        "refits": [{
            "link_class": f.link_class, "collective": f.collective, "freed": f.freed,
            "candidates": list(f.candidates),
            "before": {"latency_s": f.before.latency_s,
                       "bandwidth_bytes_per_s": f.before.bandwidth_bytes_per_s},
            "after": {"latency_s": f.fit.latency_s,
                      "bandwidth_bytes_per_s": f.fit.bandwidth_bytes_per_s},
            "points": [{"size_bytes": p.size_bytes, "measured_s": p.time_s, "residual": r}
                       for p, r in zip(f.points, f.fit.residuals, strict=True)],
        } for f in fb.refits],
        "compute_scale": fb.compute_scale,
        "gemm_max_efficiency": {"before": fb.gemm_before, "after": fb.gemm_after},
        "left_out": list(fb.skipped),
    }


def results_document(plan_source: str, launcher: str, options: VerifyOptions,
                     profile_source: str, results: Sequence[CandidateResult],
                     summary: dict[str, Any] | None, fb: Feedback | None) -> dict[str, Any]:
    """The verify JSON: candidates so far, and the comparison once all have run."""
    doc: dict[str, Any] = {
        "format": RESULTS_FORMAT, "plan": plan_source, "launcher": launcher,
        "profile": profile_source, "scale": options.scale, "steps": options.steps,
        "warmup_steps": options.warmup_steps,
        "candidate_timeout_s": options.candidate_timeout_s,
        "candidates": [r.document() for r in results],
        "complete": summary is not None,
    }
    if summary is not None:
        doc.update(summary)
    if fb is not None:
        doc["calibration"] = feedback_document(fb)
    return document(VerifyResults, doc)


def render(doc: dict[str, Any]) -> list[str]:
    """The closing table and verdicts."""
    refit = "after_calibration" in doc
    header = f"{'#':>2}  {'layout':28s} {'order':12s} {'status':8s} {'measured':>9s} " \
             f"{'predicted':>9s} {'error':>6s}"
    if refit:
        header += f" {'refit':>9s} {'error':>6s}"
    lines = [header]
    for c in doc["candidates"]:
        after = c.get("after_calibration") or {}
        row = (f"{c['index']:>2}  {short_layout(c['layout']):28s} {c['mesh_order']:12s} "
               f"{c['status']:8s} "
               f"{_s(c['measured_step_s']):>9s} {_s(c['predicted_step_s']):>9s} "
               f"{_pct(c['relative_error']):>6s}")
        if refit:
            row += (f" {_s(after.get('predicted_step_s')):>9s} "
                    f"{_pct(after.get('relative_error')):>6s}")
        lines.append(row)
    lines.append(_verdict("predicted", doc))
    if refit:
        after = doc["after_calibration"]
        lines.append(_verdict("after refitting the profile", after))
        change = after["ranking_change_tau"]
        lines.append(f"ranking change from the refit: Kendall tau {change:+.2f} between the "
                     f"rankings (order {after['order_before']} -> {after['order_after']})")
        loo = after.get("leave_one_out_max_abs_relative_error")
        if loo is not None:
            lines.append(f"leave-one-out (each candidate predicted from the others' replays): "
                         f"max |error| {loo:.0%}")
        for f in doc["calibration"]["refits"]:
            resid = ", ".join(f"{p['size_bytes']} B {p['residual']:+.0%}" for p in f["points"])
            lines.append(
                f"  refit {f['link_class']} {f['collective']} ({f['freed']}): latency "
                f"{f['before']['latency_s'] * 1e6:.0f} -> {f['after']['latency_s'] * 1e6:.0f} us, "
                f"bw {f['before']['bandwidth_bytes_per_s'] / 1e6:.1f} -> "
                f"{f['after']['bandwidth_bytes_per_s'] / 1e6:.1f} MB/s; residuals {resid}")
        gemm = doc["calibration"]["gemm_max_efficiency"]
        scale = doc["calibration"]["compute_scale"]
        if gemm["before"] is not None and scale is not None:
            lines.append(f"  refit compute: step times fit with compute x {scale:.2f}, GEMM max "
                         f"efficiency {gemm['before']:.3f} -> {gemm['after']:.3f}")
        for note in doc["calibration"]["left_out"]:
            lines.append(f"  left out of the refit: {note}")
    return lines


def _verdict(what: str, summary: dict[str, Any]) -> str:
    tau = summary.get("kendall_tau")
    if tau is None:
        return f"{what}: no candidate ran to completion"
    best = "yes" if summary["predicted_best_is_measured_best"] else "no"
    return (f"{what}: Kendall tau {tau:+.2f}; predicted best (candidate "
            f"{summary['predicted_best']}) was the measured best: {best}; max |error| "
            f"{summary['max_abs_relative_error']:.0%}")
