"""``placer calibrate``: measure collectives and GEMMs under torchrun, fit a link profile.

The sweep (workers/bench.py) times each collective a plan uses over one group per link class and
group size: ``intra_node`` groups are ranks of one node, ``inter_node`` groups one rank per node,
measured one group at a time. Each (link class, collective) is fitted with the cost model's own
formula (placer/cost/collectives.py): ``time = c1 x latency + c2 x bytes / bus_bandwidth`` with

    all_reduce      c1 = 2(p-1)   c2 = 2(p-1)/p   (ring)
    all_gather      c1 = p-1      c2 = (p-1)/p    (ring; bytes = gathered output)
    reduce_scatter  c1 = p-1      c2 = (p-1)/p    (ring; bytes = input)
    all_to_all      c1 = 1        c2 = (p-1)/p    (bytes = per-rank buffer)
    send_recv       c1 = 1        c2 = 1

so the fitted figures drop into a ``LinkProfile`` unchanged. The all-reduce fit is the class
default; another collective gets its own entry when its fit describes its points clearly better
(gloo's reduce-scatter costs about an all-reduce, cpu-cluster-notes.md section 3).

GEMMs: square ``n x n x n`` products on every rank at once, timed per batch on the slowest rank
(a step waits for it); ``time = (F + F_half) / (peak x max_efficiency)`` is the cost model's
GEMM formula (placer/cost/compute.py), linear in F, so the same least squares gives
``max_efficiency`` and ``half_efficiency_flops``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from placer.errors import PlacerError, from_validation_error
from placer.spec.documents import BENCH_FORMAT, BenchConfig, BenchResults, document
from placer.spec.gpu import GPU
from placer.spec.profile import (
    COLLECTIVE_NAMES,
    GemmProfile,
    LinkClassProfile,
    LinkMeasurement,
    LinkProfile,
)
from placer.verify.fit import (
    AlphaBetaFit,
    TimedPoint,
    fit_alpha_beta,
    median,
    relative_residuals,
    weighted_error,
)
from placer.verify.runner import Launcher

LINK_CLASSES = ("intra_node", "inter_node")
WORKERS_DIR = Path(__file__).resolve().parent / "workers"
KIB, MIB = 1024, 1024 * 1024
# Message sizes: 4 KiB to 256 MiB in factors of 4 on real hardware (the sweep); on CPUs
# gloo moves ~0.7 GB/s on loopback and 50 MB/s over a 400 Mbit/s link, so 16 MiB (0.34 s across
# the link) is the largest size that keeps a calibration under a minute.
SMALLEST_MESSAGE_BYTES = 4 * KIB
CPU_LARGEST_MESSAGE_BYTES = 16 * MIB
GPU_LARGEST_MESSAGE_BYTES = 256 * MIB
CPU_GEMM_SIZES = (128, 256, 512, 1024)
GPU_GEMM_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
# A collective keeps its own profile entry when the class default describes its points worse than
# its own fit by more than this much time-weighted relative error (fit.weighted_error).
OVERRIDE_GAIN = 0.05


@dataclass(frozen=True)
class Sweep:
    """What to measure and how long each timed batch runs."""

    sizes_bytes: tuple[int, ...]
    collectives: tuple[str, ...] = COLLECTIVE_NAMES
    gemm_sizes: tuple[int, ...] = CPU_GEMM_SIZES
    batches: int = 3
    min_batch_s: float = 0.05
    max_calls: int = 50
    # GEMM batches run on every rank at once; long enough that the ranks really overlap (the
    # barrier before each size releases them a few ms apart) and share the cores as in a step.
    gemm_min_batch_s: float = 0.25


def message_sizes(largest_bytes: int, smallest_bytes: int = SMALLEST_MESSAGE_BYTES
                  ) -> tuple[int, ...]:
    """Powers of 4 from ``smallest_bytes`` up to ``largest_bytes`` (both included)."""
    if largest_bytes < smallest_bytes:
        raise PlacerError(f"--max-message-mib: {largest_bytes / MIB:g} MiB is below the "
                          f"smallest size, {smallest_bytes // KIB} KiB")
    sizes, size = [], smallest_bytes
    while size <= largest_bytes:
        sizes.append(size)
        size *= 4
    return tuple(sizes)


def default_sweep(cuda: bool, largest_bytes: int | None = None) -> Sweep:
    largest = largest_bytes or (GPU_LARGEST_MESSAGE_BYTES if cuda else CPU_LARGEST_MESSAGE_BYTES)
    return Sweep(sizes_bytes=message_sizes(largest),
                 gemm_sizes=GPU_GEMM_SIZES if cuda else CPU_GEMM_SIZES)


def group_sizes(count: int) -> list[int]:
    """Group sizes measured over ``count`` candidates: powers of two from 2, and ``count``."""
    sizes = [2**k for k in range(1, count.bit_length()) if 2**k <= count]
    if count >= 2 and count not in sizes:
        sizes.append(count)
    return sizes


def bench_config(sweep: Sweep, num_nodes: int, gpus_per_node: int,
                 backend: str = "auto", timeout_s: float = 300.0) -> dict[str, Any]:
    """The worker's config: one test per (link class, group size, collective)."""
    tests = []
    for link_class, count in (("intra_node", gpus_per_node), ("inter_node", num_nodes)):
        for size in group_sizes(count):
            for collective in sweep.collectives:
                if collective == "send_recv" and size != 2:
                    continue  # a point-to-point transfer has two ends
                tests.append({"link_class": link_class, "group_size": size,
                              "collective": collective, "sizes_bytes": list(sweep.sizes_bytes)})
    return document(BenchConfig, {
        "backend": backend, "timeout_s": timeout_s, "batches": sweep.batches,
        "min_batch_s": sweep.min_batch_s, "max_calls": sweep.max_calls,
        "gemm_min_batch_s": sweep.gemm_min_batch_s,
        "gemm_sizes": list(sweep.gemm_sizes), "tests": tests})


def worker_argv(config_path: Path, out_dir: Path) -> list[str]:
    return [str(WORKERS_DIR / "bench.py"), str(config_path), str(out_dir)]


def run_bench(launcher: Launcher, sweep: Sweep, work_dir: Path, timeout_s: float
              ) -> dict[str, Any]:
    """Run the sweep under ``launcher``; the measurements as the worker wrote them."""
    work_dir.mkdir(parents=True, exist_ok=True)
    config = bench_config(sweep, launcher.num_nodes, launcher.gpus_per_node,
                          backend=launcher.backend, timeout_s=max(60.0, timeout_s))
    config_path = work_dir / "bench_config.json"
    config_path.write_text(json.dumps(config, indent=1, sort_keys=True))
    out = work_dir / "bench.json"
    out.unlink(missing_ok=True)
    result = launcher.run(worker_argv(config_path, work_dir), work_dir / "logs", timeout_s)
    if not result.ok or not out.is_file():
        why = "timed out" if result.status == "timeout" else f"failed ({result.exit_codes})"
        raise PlacerError(f"calibration run on {launcher.description} {why} after "
                          f"{result.wall_s:.0f} s; logs in {work_dir / 'logs'}: "
                          f"{result.log_tail.splitlines()[-1] if result.log_tail else ''}")
    return load_bench(out)


def load_bench(path: Path) -> dict[str, Any]:
    """Read a bench.json the worker wrote (``calibrate --from``)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PlacerError(f"{path}: cannot read calibration measurements ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != BENCH_FORMAT:
        raise PlacerError(f"{path}: not a {BENCH_FORMAT} file written by workers/bench.py")
    try:
        BenchResults.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, str(path), schema="bench") from None
    return data


# ------------------------------------------------------------------ fitting


def coefficients(collective: str, group_size: int) -> tuple[float, float]:
    """(latency terms, bytes factor) of one call, as placer/cost/collectives.py counts them."""
    p = group_size
    if collective == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if collective in ("all_gather", "reduce_scatter"):
        return float(p - 1), (p - 1) / p
    if collective == "all_to_all":
        return 1.0, (p - 1) / p
    if collective == "send_recv":
        return 1.0, 1.0
    raise ValueError(f"unknown collective {collective!r}")


def timed_point(collective: str, group_size: int, size_bytes: int, time_s: float) -> TimedPoint:
    c1, c2 = coefficients(collective, group_size)
    return TimedPoint(size_bytes, time_s, c1, c2 * size_bytes)


@dataclass(frozen=True)
class CollectiveFit:
    """One (link class, collective) fit, with its points for the residual report."""

    link_class: str
    collective: str
    group_sizes: tuple[int, ...]
    points: tuple[TimedPoint, ...]
    point_group_sizes: tuple[int, ...]
    fit: AlphaBetaFit
    in_profile: bool  # the class default, or an override the profile keeps

    @property
    def is_default(self) -> bool:
        return self.collective == "all_reduce"


@dataclass(frozen=True)
class GemmFit:
    sizes: tuple[int, ...]
    points: tuple[TimedPoint, ...]
    fit: AlphaBetaFit
    peak_flops: float
    profile: GemmProfile


@dataclass(frozen=True)
class CalibrationResult:
    """A fitted profile and every fit behind it."""

    profile: LinkProfile
    collectives: tuple[CollectiveFit, ...]
    gemm: GemmFit | None
    source: str
    unfitted: tuple[str, ...] = ()


def _points_by_class(bench: dict[str, Any]) -> dict[tuple[str, str], list[tuple[int, TimedPoint]]]:
    out: dict[tuple[str, str], list[tuple[int, TimedPoint]]] = {}
    for test in bench.get("collectives", []):
        key = (test["link_class"], test["collective"])
        p = 2 if test["collective"] == "send_recv" else int(test["group_size"])
        for point in test["points"]:
            if point["times_s"]:
                out.setdefault(key, []).append(
                    (p, timed_point(test["collective"], p, int(point["size_bytes"]),
                                    median(point["times_s"]))))
    return out


def _error_under(fit: AlphaBetaFit, points: Sequence[TimedPoint]) -> float:
    residuals = relative_residuals(fit.latency_s, fit.bandwidth_bytes_per_s, points)
    return weighted_error(residuals, [p.time_s for p in points])


def fit_collectives(bench: dict[str, Any]) -> tuple[list[CollectiveFit], list[str]]:
    """Fit every measured (link class, collective); mark which ones the profile keeps.

    A collective whose points cannot be fitted (times that do not grow with size) is left out
    of the profile, with the reason, instead of failing the whole calibration.
    """
    fits: list[CollectiveFit] = []
    unfitted: list[str] = []
    grouped = _points_by_class(bench)
    for link_class in LINK_CLASSES:
        own: dict[str, tuple[list[int], list[TimedPoint], AlphaBetaFit]] = {}
        for collective in COLLECTIVE_NAMES:
            entries = grouped.get((link_class, collective))
            if not entries:
                continue
            sizes = [p for p, _ in entries]
            points = [pt for _, pt in entries]
            try:
                fit = fit_alpha_beta(points, what=f"{link_class} {collective}")
            except PlacerError as exc:
                unfitted.append(str(exc))
                continue
            own[collective] = (sizes, points, fit)
        if not own:
            continue
        default_name = "all_reduce" if "all_reduce" in own else next(iter(own))
        default = own[default_name][2]
        for collective, (sizes, points, fit) in own.items():
            keep = collective == default_name or (
                _error_under(default, points) - fit.weighted_error > OVERRIDE_GAIN)
            fits.append(CollectiveFit(link_class, collective, tuple(sorted(set(sizes))),
                                      tuple(points), tuple(sizes), fit, keep))
    return fits, unfitted


def fit_gemm(bench: dict[str, Any], gpu: GPU) -> GemmFit | None:
    """Per size, the median over batches of the slowest rank's time; fit the GEMM formula."""
    per_rank = bench.get("gemm") or {}
    by_n: dict[int, list[float]] = {}
    for rows in per_rank.values():
        for row in rows:
            by_n.setdefault(int(row["n"]), []).append(median(row["times_s"]))
    if not by_n:
        return None
    sizes = tuple(sorted(by_n))
    points = tuple(TimedPoint(n, max(by_n[n]), 1.0, 2.0 * n**3) for n in sizes)
    fit = fit_alpha_beta(points, what="GEMM sweep")
    rate = fit.bandwidth_bytes_per_s  # FLOP/s of large GEMMs: peak x max_efficiency
    peak = gpu.bf16_flops
    if rate > peak:
        raise PlacerError(
            f"GEMM sweep: large GEMMs ran at {rate:.3g} FLOP/s, above the GPU's bf16_flops "
            f"{peak:.3g} ({gpu.name}); the cluster file understates the peak")
    profile = GemmProfile(max_efficiency=_round(rate / peak),
                          half_efficiency_flops=_round(fit.latency_s * rate))
    return GemmFit(sizes, points, fit, peak, profile)


def _round(value: float, digits: int = 4) -> float:
    """Significant digits: the fits are not more precise, and the file stays readable."""
    return float(f"{value:.{digits}g}")


def _measurement(fit: AlphaBetaFit) -> dict[str, float]:
    return {"latency_s": _round(fit.latency_s),
            "bandwidth_bytes_per_s": _round(fit.bandwidth_bytes_per_s)}


def build_profile(fits: Sequence[CollectiveFit], gemm: GemmFit | None, cluster: str | None,
                  gpu: str | None) -> LinkProfile:
    sections: dict[str, LinkClassProfile] = {}
    for link_class in LINK_CLASSES:
        mine = [f for f in fits if f.link_class == link_class and f.in_profile]
        if not mine:
            continue
        default = next((f for f in mine if f.is_default), mine[0])
        overrides = {f.collective: LinkMeasurement(**_measurement(f.fit))
                     for f in mine if f is not default}
        sections[link_class] = LinkClassProfile(**_measurement(default.fit),
                                                collectives=overrides)
    return LinkProfile(cluster=cluster, gpu=gpu, gemm=gemm.profile if gemm else None,
                       **sections)


def calibrate_from_bench(bench: dict[str, Any], gpu: GPU, cluster_name: str | None,
                         source: str) -> CalibrationResult:
    fits, unfitted = fit_collectives(bench)
    if not fits:
        why = unfitted[0] if unfitted else ("no collective was measured (a single rank cannot "
                                            "run collectives; use at least 2 ranks, or --emulate)")
        raise PlacerError(f"{source}: {why}")
    gemm = fit_gemm(bench, gpu)
    profile = build_profile(fits, gemm, cluster_name, gpu.name)
    return CalibrationResult(profile, tuple(fits), gemm, source, tuple(unfitted))


def gemm_only(bench: dict[str, Any], gpu: GPU, cluster_name: str | None) -> CalibrationResult:
    """One rank: no collectives, only the GEMM sweep (e.g. one GPU)."""
    gemm = fit_gemm(bench, gpu)
    if gemm is None:
        raise PlacerError("nothing was measured: no GEMM sweep and no collectives")
    return CalibrationResult(LinkProfile(cluster=cluster_name, gpu=gpu.name, gemm=gemm.profile), (),
                       gemm, "gemm")


# ------------------------------------------------------------------ output


def profile_document(profile: LinkProfile) -> dict[str, Any]:
    return profile.model_dump(mode="json", exclude_none=True, exclude_defaults=False)


def profile_yaml(profile: LinkProfile) -> str:
    return yaml.safe_dump(profile_document(profile), sort_keys=False, default_flow_style=False)


def _size_text(nbytes: int) -> str:
    if nbytes >= MIB:
        return f"{nbytes / MIB:g}M"
    return f"{nbytes / KIB:g}K"


def report_lines(cal: CalibrationResult) -> list[str]:
    """Human-readable fit report: each fit, then its residual per point."""
    lines = [f"measurements: {cal.source}"]
    for f in cal.collectives:
        role = ("class default" if f.is_default else
                "override" if f.in_profile else "not kept (default fits it)")
        sizes = ",".join(map(str, f.group_sizes))
        lines.append(
            f"{f.link_class:10s} {f.collective:14s} p={sizes:5s} "
            f"latency {f.fit.latency_s * 1e6:9.1f} us  "
            f"bus bw {f.fit.bandwidth_bytes_per_s / 1e6:9.1f} MB/s  "
            f"error {f.fit.weighted_error:5.1%} (max {f.fit.max_abs_residual:4.0%})  [{role}]")
        several = len(f.group_sizes) > 1
        resid = "  ".join(
            f"{_size_text(pt.size_bytes)}{f'/p{p}' if several else ''} {r:+.0%}"
            for p, pt, r in zip(f.point_group_sizes, f.points, f.fit.residuals, strict=True))
        lines.append(f"    residuals: {resid}")
    lines += [f"not fitted: {why}" for why in cal.unfitted]
    if cal.gemm is not None:
        g = cal.gemm
        lines.append(
            f"GEMM       max efficiency {g.profile.max_efficiency:.3f} of {g.peak_flops:.3g} "
            f"FLOP/s, half at {g.profile.half_efficiency_flops or 0:.3g} FLOPs, "
            f"error {g.fit.weighted_error:.1%}")
        lines.append("    measured: " + "  ".join(
            f"n={n} {pt.bytes_coeff / pt.time_s / 1e9:.1f} GFLOP/s ({r:+.0%})"
            for n, pt, r in zip(g.sizes, g.points, g.fit.residuals, strict=True)))
    return lines
