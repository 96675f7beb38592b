"""bench/fit_compute must be able to fit the MoE host launch time from 0.

compute.pass_times takes the longer of a layer's GPU time and its host launch time, so the host
constants move no row until they exceed a layer's GPU time: a search whose first steps from 0 stay
below every row's GPU time never leaves 0. A hand-built truth: a row whose GPU time is 1.0 and whose
measured time is 1.3, host-bound at 16 local experts x h with the GPU time reached at h = 130 us,
is fitted at h = 1.3 x 130 = 169 us.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import accuracy  # noqa: E402
import fit_compute  # noqa: E402

ROW = "mbridge2511_b200_qwen3_30b_a3b_fp8_mx_8gpu"
GPU_S, MEASURED_S, EXPERTS, BINDS_AT_S = 1.0, 1.3, 16, 130e-6


def host_bound(cases: list[accuracy.Case], values: dict[str, Any]) -> list[float]:
    """Each row's tokens/s when its time is max(GPU time, host launch time) (pass_times)."""
    host = EXPERTS * values["moe_host_s_per_expert"] / (EXPERTS * BINDS_AT_S) * GPU_S
    return [c.reported_tps * MEASURED_S / max(GPU_S, host) for c in cases]


def test_fit_reaches_a_host_bound_row_from_zero() -> None:
    case = next(c for c in accuracy.load()[0] if c.record_id == ROW)
    values = fit_compute.fit([case], predict=host_bound)
    assert values["moe_host_s_per_expert"] == pytest.approx(MEASURED_S * BINDS_AT_S, rel=0.02)
    assert fit_compute.loss([case], values, predict=host_bound) < 1e-3


def test_the_first_step_from_zero_reaches_the_binding_range() -> None:
    """The first round's largest try from 0 (half the floor) is above the binding point."""
    assert fit_compute.STEP_FLOOR["moe_host_s_per_expert"] / 2 > BINDS_AT_S
    assert fit_compute.STEP_FLOOR["moe_host_s_per_layer"] / 2 > EXPERTS * BINDS_AT_S
