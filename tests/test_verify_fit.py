"""Least squares and rank agreement used by calibrate and verify."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from placer.errors import PlacerError
from placer.verify.fit import (
    TimedPoint,
    fit_alpha_beta,
    kendall_tau,
    median,
    relative_residuals,
    weighted_error,
)

SIZES = [4096 * 4**k for k in range(8)]


def points(alpha: float, bandwidth: float, c1: float = 2.0, c2: float = 1.0,
           noise: list[float] | None = None) -> list[TimedPoint]:
    out = []
    for i, size in enumerate(SIZES):
        t = c1 * alpha + c2 * size / bandwidth
        if noise:
            t *= 1 + noise[i]
        out.append(TimedPoint(size, t, c1, c2 * size))
    return out


def test_exact_points_give_back_their_parameters() -> None:
    fit = fit_alpha_beta(points(3e-4, 5e7))
    assert fit.latency_s == pytest.approx(3e-4, rel=1e-9)
    assert fit.bandwidth_bytes_per_s == pytest.approx(5e7, rel=1e-9)
    assert fit.max_abs_residual < 1e-9
    assert fit.weighted_error < 1e-9
    assert fit.predict_s(2.0, SIZES[3]) == pytest.approx(2 * 3e-4 + SIZES[3] / 5e7)


def test_noisy_points_stay_close_and_report_their_residuals() -> None:
    rng = random.Random(7)
    noise = [rng.uniform(-0.1, 0.1) for _ in SIZES]
    fit = fit_alpha_beta(points(1e-3, 1e9, noise=noise))
    assert fit.bandwidth_bytes_per_s == pytest.approx(1e9, rel=0.1)
    assert len(fit.residuals) == len(SIZES)
    assert 0 < fit.max_abs_residual < 0.25
    # The residuals are the relative errors of the fitted model on each point.
    expected = relative_residuals(fit.latency_s, fit.bandwidth_bytes_per_s,
                                  points(1e-3, 1e9, noise=noise))
    assert list(fit.residuals) == pytest.approx(expected)


def test_large_messages_decide_the_bandwidth() -> None:
    # Small messages twice as fast as the model (a token bucket's burst) must not inflate the
    # bandwidth the large ones show: time-weighted errors keep it within a few percent.
    pts = [TimedPoint(p.size_bytes, p.time_s * (0.5 if p.size_bytes < 300_000 else 1.0),
                      p.latency_coeff, p.bytes_coeff) for p in points(2e-4, 5e7)]
    fit = fit_alpha_beta(pts)
    assert fit.bandwidth_bytes_per_s == pytest.approx(5e7, rel=0.05)


def test_negative_latency_is_pinned_at_zero() -> None:
    # Times proportional to size minus a constant: the free fit would want alpha < 0.
    pts = [TimedPoint(s, s / 1e8 * 1.2 - 1e-5 if s > 5000 else 3e-5, 1.0, float(s))
           for s in SIZES]
    fit = fit_alpha_beta(pts)
    assert fit.latency_s == 0.0
    assert fit.bandwidth_bytes_per_s > 0


def test_one_parameter_fits_hold_the_other() -> None:
    pts = points(5e-4, 2e8)
    by_bw = fit_alpha_beta(pts, latency_s=5e-4)
    assert by_bw.latency_s == 5e-4
    assert by_bw.bandwidth_bytes_per_s == pytest.approx(2e8)
    by_lat = fit_alpha_beta(pts, bandwidth_bytes_per_s=2e8)
    assert by_lat.latency_s == pytest.approx(5e-4)
    assert by_lat.bandwidth_bytes_per_s == 2e8


def test_flat_times_cannot_give_a_bandwidth() -> None:
    pts = [TimedPoint(s, 1e-3, 2.0, float(s)) for s in SIZES[:3]]
    pts.append(TimedPoint(SIZES[3], 0.9e-3, 2.0, float(SIZES[3])))
    with pytest.raises(PlacerError, match="do not grow with message size"):
        fit_alpha_beta(pts, what="intra all_reduce")


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_bad_measurements_are_refused(bad: float) -> None:
    with pytest.raises(PlacerError, match="not a positive number"):
        fit_alpha_beta([TimedPoint(4096, bad, 1.0, 4096.0)])
    with pytest.raises(PlacerError, match="no measured points"):
        fit_alpha_beta([])


def test_weighted_error_weighs_by_time() -> None:
    assert weighted_error([0.1, 0.1], [1.0, 3.0]) == pytest.approx(0.1)
    assert weighted_error([0.0, 0.2], [1.0, 3.0]) == pytest.approx(math.sqrt(0.04 * 3 / 4))


def _tau_by_definition(x: list[float], y: list[float]) -> float:
    pairs = list(itertools.combinations(range(len(x)), 2))
    con = sum(1 for i, j in pairs if (x[i] - x[j]) * (y[i] - y[j]) > 0)
    dis = sum(1 for i, j in pairs if (x[i] - x[j]) * (y[i] - y[j]) < 0)
    return (con - dis) / len(pairs)


def test_kendall_tau() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert kendall_tau([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.8)
    rng = random.Random(3)
    for _ in range(20):
        x = rng.sample(range(100), 7)
        y = rng.sample(range(100), 7)
        assert kendall_tau(x, y) == pytest.approx(_tau_by_definition(x, y))
    # tau-b with a tie: scipy.stats.kendalltau([1, 2, 2, 3], [1, 2, 3, 4]) = 0.9128709
    assert kendall_tau([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9128709, abs=1e-6)
    assert kendall_tau([5.0], [1.0]) == 1.0
    with pytest.raises(ValueError):
        kendall_tau([1, 2], [1])


def test_median() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_the_emulated_report_names_core_sharing_only_when_ranks_outnumber_cores() -> None:
    from placer.verify.cpu_cluster import oversubscription_note

    note = oversubscription_note(8, cores=2)
    assert note is not None and "8 ranks share 2 cores" in note
    assert oversubscription_note(2, cores=2) is None
