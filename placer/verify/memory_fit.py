"""Fit the profile's memory terms to measured peaks (``placer calibrate --real-model``).

The memory model counts weights, gradients and optimizer state exactly (the real-model runs
measure them to the byte); what it estimates is the dynamic part. So every measured peak m of
a candidate whose model predicted static bytes s and dynamic bytes d is one point of

    m = s + overhead + scale x d

fitted over all measured candidates at once by least squares on the relative error
(``sum ((s + overhead + scale x d - m) / m)^2``) with ``overhead >= 0``: the two terms of
``MemoryProfile``. Points that do not tell the two apart (one candidate, or dynamic parts all in
the same proportion to the peak), or whose joint fit needs a negative overhead or an implausible
scale (candidates that disagree about the mechanism), fit the scale alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from placer.errors import PlacerError
from placer.spec.profile import MemoryProfile
from placer.verify.fit import least_squares_two

# The scale a fit may return (MemoryProfile.activation_scale's bounds): beyond them the model
# and the measurement disagree about what was run, which a constant must not paper over.
MIN_SCALE, MAX_SCALE = 0.1, 10.0


@dataclass(frozen=True)
class MemoryPoint:
    """One measured candidate: the memory model's static and dynamic bytes, the measured peak."""

    label: str
    static_bytes: int
    dynamic_bytes: int
    measured_bytes: int

    def predicted(self, scale: float = 1.0, overhead_bytes: float = 0.0) -> float:
        return self.static_bytes + overhead_bytes + scale * self.dynamic_bytes

    def error(self, scale: float = 1.0, overhead_bytes: float = 0.0) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted(scale, overhead_bytes) - self.measured_bytes) / self.measured_bytes


@dataclass(frozen=True)
class MemoryFit:
    """The fitted terms and the points behind them."""

    profile: MemoryProfile
    points: tuple[MemoryPoint, ...]
    freed: str  # "scale and overhead" or "scale"

    def errors(self, fitted: bool) -> list[float]:
        if not fitted:
            return [p.error() for p in self.points]
        return [p.error(self.profile.activation_scale, self.profile.overhead_bytes)
                for p in self.points]


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else 0.0


def rms_error(fit: MemoryFit, fitted: bool) -> float:
    """Root-mean-square relative error of the peaks, before or after the fit."""
    return _rms(fit.errors(fitted))


def _scale_only(points: Sequence[MemoryPoint]) -> float:
    num = sum(p.dynamic_bytes * (p.measured_bytes - p.static_bytes) / p.measured_bytes**2
              for p in points)
    den = sum((p.dynamic_bytes / p.measured_bytes) ** 2 for p in points)
    return num / den if den > 0 else 1.0


def _both(points: Sequence[MemoryPoint]) -> tuple[float, float] | None:
    """Unconstrained (overhead, scale); None when the points cannot separate them."""
    rows = [(1.0 / p.measured_bytes, p.dynamic_bytes / p.measured_bytes,
             (p.measured_bytes - p.static_bytes) / p.measured_bytes) for p in points]
    return least_squares_two(rows, 1e-9) if len(points) >= 2 else None


def fit_memory(points: Sequence[MemoryPoint], device: str | None) -> MemoryFit:
    """The least-squares memory terms over every point (see the module docstring)."""
    if not points:
        raise PlacerError("--real-model: no candidate ran to completion with a measured peak; "
                          "nothing to fit the memory terms to")
    if not any(p.dynamic_bytes > 0 for p in points):
        raise PlacerError("--real-model: the measured candidates have no dynamic memory to "
                          "scale")
    both = _both(points)
    if both is not None and both[0] >= 0 and MIN_SCALE <= both[1] <= MAX_SCALE:
        overhead, scale = both
        freed = "scale and overhead"
    else:
        overhead, scale = 0.0, _scale_only(points)
        freed = "scale"
    if not MIN_SCALE <= scale <= MAX_SCALE:
        worst = max(points, key=lambda p: abs(p.error()))
        raise PlacerError(
            f"--real-model: the measured peaks need the dynamic memory x {scale:.3g} (outside "
            f"{MIN_SCALE:g}-{MAX_SCALE:g}); e.g. {worst.label} measured "
            f"{worst.measured_bytes / 2**20:.1f} MiB against {worst.predicted() / 2**20:.1f} "
            "MiB predicted: check that the results come from the plan's own model and layouts")
    profile = MemoryProfile(activation_scale=float(f"{scale:.4g}"),
                            overhead_bytes=round(overhead), device=device,
                            fitted_candidates=len(points))
    return MemoryFit(profile, tuple(points), freed)
