"""Least-squares fits of measured times, and rank agreement (Kendall's tau).

Pure functions, no torch: calibration and replay feed them measured points. Every fit is a
weighted least-squares problem whose squared errors are divided by the measured time (timing
noise whose variance grows with the time, as for a sum of independent delays). Plain least
squares would let the largest message decide everything; dividing by the time squared (relative
error, as cpu-cluster-notes.md section 3 did) lets the many latency-bound sizes decide the
bandwidth too, and on a tbf-shaped link, whose burst lets small messages through unshaped, that
overstated the bandwidth by 10-15 % (45 against 27 MB/s for gloo's all-to-all, whose large
messages really move at 27). Residuals are returned as relative errors so callers can print them:
a fit that does not describe its points must say so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from placer.errors import PlacerError


@dataclass(frozen=True)
class TimedPoint:
    """One measured time ``time_s`` modelled as ``latency_coeff * alpha + bytes_coeff * beta``.

    ``latency_coeff`` counts latency terms (ring steps); ``bytes_coeff`` is the bytes that cross
    the bottleneck link (a ring all-reduce of S bytes over p ranks moves 2(p-1)/p * S), so beta is
    seconds per byte and 1/beta a bus bandwidth in the nccl-tests sense.
    """

    size_bytes: int
    time_s: float
    latency_coeff: float
    bytes_coeff: float


@dataclass(frozen=True)
class AlphaBetaFit:
    """A fitted latency and bandwidth with the relative residual of every point, in input order."""

    latency_s: float
    bandwidth_bytes_per_s: float
    residuals: tuple[float, ...]
    sizes_bytes: tuple[int, ...]
    times_s: tuple[float, ...]

    @property
    def weighted_error(self) -> float:
        """The fit's objective as one figure: the rms relative residual weighted by time."""
        return weighted_error(self.residuals, self.times_s)

    @property
    def max_abs_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)

    @property
    def rms_residual(self) -> float:
        if not self.residuals:
            return 0.0
        return math.sqrt(sum(r * r for r in self.residuals) / len(self.residuals))

    def predict_s(self, latency_coeff: float, bytes_coeff: float) -> float:
        return latency_coeff * self.latency_s + bytes_coeff / self.bandwidth_bytes_per_s


def _weighted_rows(points: Sequence[TimedPoint]) -> list[tuple[float, float, float]]:
    """Rows (coefficients, right-hand side) of the system, each divided by sqrt(time)."""
    rows = []
    for p in points:
        w = 1.0 / math.sqrt(p.time_s)
        rows.append((p.latency_coeff * w, p.bytes_coeff * w, p.time_s * w))
    return rows


def _solve_two(points: Sequence[TimedPoint]) -> tuple[float, float] | None:
    """Unconstrained weighted least squares for (alpha, beta); None if singular."""
    return least_squares_two(_weighted_rows(points))


def least_squares_two(rows: Sequence[tuple[float, float, float]], tolerance: float = 1e-12
                      ) -> tuple[float, float] | None:
    """(x, y) minimising sum (a x + b y - t)^2 over rows (a, b, t); None when the rows cannot
    separate x from y (the normal equations' determinant within ``tolerance`` of zero)."""
    a11 = sum(x * x for x, _, _ in rows)
    a12 = sum(x * y for x, y, _ in rows)
    a22 = sum(y * y for _, y, _ in rows)
    b1 = sum(x * t for x, _, t in rows)
    b2 = sum(y * t for _, y, t in rows)
    det = a11 * a22 - a12 * a12
    if det <= tolerance * max(a11 * a22, 1e-300):
        return None
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def _solve_one_given(points: Sequence[TimedPoint], column: int, other: float) -> float:
    """Weighted least squares for one unknown (column 0: alpha, 1: beta), the other fixed."""
    num = den = 0.0
    for row in _weighted_rows(points):
        rest = row[2] - row[1 - column] * other
        num += row[column] * rest
        den += row[column] ** 2
    return num / den if den > 0 else 0.0


def _check_points(points: Sequence[TimedPoint], what: str) -> None:
    if not points:
        raise PlacerError(f"{what}: no measured points to fit")
    for p in points:
        if not (p.time_s > 0 and math.isfinite(p.time_s)):
            raise PlacerError(f"{what}: measured time {p.time_s!r} s is not a positive number")
        if p.latency_coeff < 0 or p.bytes_coeff < 0:
            raise PlacerError(f"{what}: negative model coefficient for {p.size_bytes} bytes")


def fit_alpha_beta(
    points: Sequence[TimedPoint],
    *,
    what: str = "fit",
    latency_s: float | None = None,
    bandwidth_bytes_per_s: float | None = None,
) -> AlphaBetaFit:
    """Fit ``time = latency_coeff * alpha + bytes_coeff / bandwidth`` with alpha >= 0.

    Either parameter can be held fixed (e.g. refitting only the bandwidth from points that all
    have one size). If the free fit gives a negative latency, the latency is pinned at 0 and the
    bandwidth refitted (the non-negative least-squares solution for two unknowns). Points whose
    time does not grow with size cannot determine a bandwidth; that is an error, not a guess.
    """
    _check_points(points, what)
    if latency_s is not None and bandwidth_bytes_per_s is not None:
        alpha, beta = latency_s, 1.0 / bandwidth_bytes_per_s
    elif bandwidth_bytes_per_s is not None:
        beta = 1.0 / bandwidth_bytes_per_s
        alpha = max(0.0, _solve_one_given(points, 0, beta))
    elif latency_s is not None:
        alpha = latency_s
        beta = _solve_one_given(points, 1, alpha)
    else:
        solved = _solve_two(points)
        if solved is None or solved[0] < 0:
            alpha, beta = 0.0, _solve_one_given(points, 1, 0.0)
        else:
            alpha, beta = solved
    if not beta > 0:
        sizes = sorted({p.size_bytes for p in points})
        raise PlacerError(
            f"{what}: the measured times do not grow with message size ({sizes[0]}..{sizes[-1]} "
            "bytes), so no bandwidth can be fitted; measure larger messages"
        )
    residuals = tuple(
        (p.latency_coeff * alpha + p.bytes_coeff * beta - p.time_s) / p.time_s for p in points
    )
    return AlphaBetaFit(
        latency_s=alpha,
        bandwidth_bytes_per_s=1.0 / beta,
        residuals=residuals,
        sizes_bytes=tuple(p.size_bytes for p in points),
        times_s=tuple(p.time_s for p in points),
    )


def relative_residuals(latency_s: float, bandwidth_bytes_per_s: float,
                       points: Sequence[TimedPoint]) -> list[float]:
    """(predicted - measured) / measured of each point under given parameters."""
    return [(p.latency_coeff * latency_s + p.bytes_coeff / bandwidth_bytes_per_s - p.time_s)
            / p.time_s for p in points]


def weighted_error(residuals: Sequence[float], times_s: Sequence[float]) -> float:
    """sqrt(sum r^2 t / sum t): what the fit minimises (sum (pred - t)^2 / t), made unitless."""
    total = sum(times_s)
    if total <= 0:
        return 0.0
    return math.sqrt(sum(r * r * t for r, t in zip(residuals, times_s, strict=True)) / total)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between two score lists (ties handled); 1.0 for fewer than two items.

    tau-b is what scipy.stats.kendalltau returns by default; with no ties it is
    (concordant - discordant) / (n choose 2). A list of one candidate trivially agrees.
    """
    if len(x) != len(y):
        raise ValueError(f"kendall_tau: lists differ in length ({len(x)} vs {len(y)})")
    n = len(x)
    if n < 2:
        return 1.0
    concordant = discordant = ties_x = ties_y = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx = (x[i] > x[j]) - (x[i] < x[j])
            dy = (y[i] > y[j]) - (y[i] < y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif dx == dy:
                concordant += 1
            else:
                discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    if denom == 0:
        return 1.0
    return (concordant - discordant) / denom


def median(values: Sequence[float]) -> float:
    """The median (mean of the middle two for even counts); raises on an empty list."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2.0
