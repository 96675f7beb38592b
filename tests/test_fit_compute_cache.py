"""bench/fit_compute's trial cache (a row is re-costed only when a Calibration field its earlier
estimate read changes) must fit exactly what re-costing every row in every trial fits."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import accuracy  # noqa: E402
import fit_compute  # noqa: E402

# One row per mechanism the cache keys on: an MoE row (dispatch and host-launch terms), a
# Jean Zay row (the fitted network), an overlapped-TP row, a ZeRO-3 row, and each GPU family.
ROWS = ("mbridge2511_h100_gpt_oss_120b_bf16_64gpu", "bloom_176b_production",
        "mcore_r080_h100_weak_7.1B", "narayanan21_t2_zero3_175B_384gpu",
        "mbridge2511_gb200_llama3_8b_fp8_cs_8gpu", "narayanan21_t1_1.7B")


def recost_every_row(cases: list[accuracy.Case], values: dict[str, Any]) -> list[float]:
    """The truth the cache must reproduce: every row estimated afresh under ``values``."""
    return [o.predicted_tps for o in accuracy.run(cases, accuracy.tune_from(values))]


def test_cached_fit_equals_recosting_every_row() -> None:
    by_id = {c.record_id: c for c in accuracy.load()[0]}
    cases = [by_id[rid] for rid in ROWS]
    cached = fit_compute.fit(cases, rounds=2, cycles=1)
    estimated = len(fit_compute._PREDICTED)  # fit starts its cache empty
    plain = fit_compute.fit(cases, rounds=2, cycles=1, predict=recost_every_row)
    assert cached == plain
    assert cached != fit_compute.initial(fit_compute.parameters(cases))  # the search moved
    assert (fit_compute.loss(cases, cached)
            == fit_compute.loss(cases, plain, predict=recost_every_row))
    # The cache held back estimates: fewer than one per row per trial.
    trials = 1 + 2 * 6 * len(fit_compute.parameters(cases))
    assert estimated < trials * len(cases)


def test_tune_from_sets_each_fitted_constant() -> None:
    """By hand: a family's own field wins over its fallback's, shared constants replace the
    calibration's, the Jean Zay bandwidth replaces that cluster's profile only, A100's attention
    follows H100's."""
    by_id = {c.record_id: c for c in accuracy.load()[0]}
    bloom, h100 = by_id["bloom_176b_production"], by_id["mcore_r080_h100_weak_7.1B"]
    values = {"gemm": {"H100": {"half_efficiency_flops": 3e10, "attention_efficiency": 0.4},
                       "B200": {"attention_efficiency": 0.3}},
              "networks": {"jean-zay": 2e9}, "overlap_efficiency": 0.7}
    tune = accuracy.tune_from(values)
    calib = tune(accuracy.calibration_of(h100))
    assert (calib.gemm.half_efficiency_flops, calib.gemm.attention_efficiency) == (3e10, 0.4)
    assert calib.overlap_efficiency == 0.7
    base = accuracy.calibration_of(h100)
    assert calib.elementwise_traffic_factor == base.elementwise_traffic_factor
    assert calib.profile == base.profile
    jz = tune(accuracy.calibration_of(bloom))
    assert jz.profile == accuracy.jean_zay_profile(2e9)
    # no A100 field given: its GEMM fields stay, its attention follows H100's by FA2's 73 % of
    # A100's peak over the Hopper kernels' 75 % of H100's (profile.ATTENTION_RELATIVE_TO)
    own = accuracy.calibration_of(bloom).gemm
    assert jz.gemm.half_efficiency_flops == own.half_efficiency_flops
    assert jz.gemm.attention_efficiency == pytest.approx(0.4 * 0.73 / 0.75)


def test_loso_folds_do_not_depend_on_processes() -> None:
    """Folds run longest first in 2 processes give the table 1 process gives, in source order."""
    by_id = {c.record_id: c for c in accuracy.load()[0]}
    cases = [by_id[rid] for rid in ROWS[:4]]
    one = accuracy.leave_one_source_out(cases, rounds=1, cycles=1, jobs=1)
    two = accuracy.leave_one_source_out(cases, rounds=1, cycles=1, jobs=2)
    assert [f.source for f in one] == sorted({c.source for c in cases})
    assert one == two
