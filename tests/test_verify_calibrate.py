"""Calibration fits: the same formula as the cost model, profiles that round-trip, sweeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from placer.cost import calibration_for
from placer.errors import PlacerError
from placer.spec.profile import COLLECTIVE_NAMES, LinkProfile, load_link_profile
from placer.topology import topology_of
from placer.verify.calibrate import (
    KIB,
    MIB,
    bench_config,
    calibrate_from_bench,
    coefficients,
    default_sweep,
    gemm_only,
    group_sizes,
    message_sizes,
    profile_yaml,
    report_lines,
)
from placer.verify.cpu_cluster import emulated_cluster
from placer.verify.replay import time_call

SIZES = message_sizes(16 * MIB)
GPU = emulated_cluster(2, 2, 400).node_types[0].gpu


def test_sweep_sizes_and_groups() -> None:
    assert SIZES == (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB)
    assert message_sizes(256 * MIB)[-1] == 256 * MIB
    assert default_sweep(cuda=True).sizes_bytes[-1] == 256 * MIB
    assert default_sweep(cuda=False).sizes_bytes[-1] == 16 * MIB
    with pytest.raises(PlacerError, match="max-message-mib"):
        message_sizes(1024)
    assert group_sizes(1) == []
    assert group_sizes(2) == [2]
    assert group_sizes(8) == [2, 4, 8]
    assert group_sizes(6) == [2, 4, 6]


def test_bench_config_measures_every_class_and_size() -> None:
    config = bench_config(default_sweep(cuda=False), num_nodes=2, gpus_per_node=4)
    keys = {(t["link_class"], t["group_size"], t["collective"]) for t in config["tests"]}
    assert ("intra_node", 4, "all_reduce") in keys and ("intra_node", 2, "all_to_all") in keys
    assert ("inter_node", 2, "reduce_scatter") in keys
    assert ("intra_node", 4, "send_recv") not in keys  # point-to-point has two ends
    assert all(t["sizes_bytes"] == list(SIZES) for t in config["tests"])
    assert config["gemm_sizes"] == [128, 256, 512, 1024]


@pytest.mark.parametrize("collective", COLLECTIVE_NAMES)
@pytest.mark.parametrize(("slots", "section"), [([0, 1], "intra_node"), ([0, 2], "inter_node")])
def test_fit_formula_is_the_cost_models(collective: str, slots: list[int], section: str) -> None:
    """A profile entry fitted with ``coefficients`` reproduces the cost model's time exactly."""
    cluster = emulated_cluster(2, 2, 400)
    # Below the NIC's per-GPU share (25 MB/s), so the cost model uses the measured figure.
    measured = {"latency_s": 3e-4, "bandwidth_bytes_per_s": 1.0e7}
    profile = LinkProfile.model_validate({
        section: {**measured, "collectives": {collective: measured}},
    })
    link = topology_of(cluster).group_link(slots, concurrent="all")
    calib = calibration_for(cluster, profile)
    c1, c2 = coefficients(collective, 2)
    for size in (4096, MIB, 16 * MIB):
        expected = c1 * 3e-4 + c2 * size / 1.0e7
        assert time_call(collective, link, size, calib).time_s == pytest.approx(expected)


def _bench(alpha: dict[str, float], bandwidth: dict[str, float], gemm_rate: float,
           gemm_overhead_s: float = 0.0) -> dict[str, Any]:
    """Measurements a worker would write if the hardware followed the formula exactly."""
    tests = []
    for section, scale in (("intra_node", 20.0), ("inter_node", 1.0)):
        for collective in COLLECTIVE_NAMES:
            c1, c2 = coefficients(collective, 2)
            points = [{"size_bytes": s, "times_s": [c1 * alpha[collective] / scale
                                                    + c2 * s / (bandwidth[collective] * scale)] * 3}
                      for s in SIZES]
            tests.append({"link_class": section, "collective": collective, "group_size": 2,
                          "ranks": [0, 1], "points": points})
    gemm = [{"n": n, "times_s": [gemm_overhead_s + 2 * n**3 / gemm_rate] * 3}
            for n in (128, 256, 512, 1024)]
    return {"format": "placer-bench/1", "world_size": 4, "backend": "gloo",
            "collectives": tests, "gemm": {"0": gemm, "1": gemm}}


ALPHA = {c: 2e-4 for c in COLLECTIVE_NAMES}
BW = {c: 5e7 for c in COLLECTIVE_NAMES}


def test_profile_keeps_overrides_only_where_a_collective_differs(tmp_path: Path) -> None:
    bandwidth = {**BW, "reduce_scatter": 2.5e7}  # gloo: reduce-scatter costs like all-reduce
    cal = calibrate_from_bench(_bench(ALPHA, bandwidth, 3e10, 1e-5), GPU, "emulated-2x2", "x")
    profile = cal.profile
    assert profile.inter_node is not None and profile.intra_node is not None
    assert profile.inter_node.bandwidth_bytes_per_s == pytest.approx(5e7, rel=1e-3)
    assert profile.inter_node.latency_s == pytest.approx(2e-4, rel=1e-3)
    assert profile.intra_node.bandwidth_bytes_per_s == pytest.approx(1e9, rel=1e-3)
    assert set(profile.inter_node.collectives) == {"reduce_scatter"}
    assert profile.inter_node.collectives["reduce_scatter"].bandwidth_bytes_per_s == (
        pytest.approx(2.5e7, rel=1e-3))
    assert profile.gemm is not None
    assert profile.gemm.max_efficiency == pytest.approx(3e10 / GPU.bf16_flops, rel=1e-3)
    # half-efficiency FLOPs = fixed overhead x large-GEMM rate
    assert profile.gemm.half_efficiency_flops == pytest.approx(1e-5 * 3e10, rel=1e-3)
    path = tmp_path / "profile.yaml"
    path.write_text(profile_yaml(profile))
    assert load_link_profile(path) == profile
    assert profile_yaml(profile) == profile_yaml(
        calibrate_from_bench(_bench(ALPHA, bandwidth, 3e10, 1e-5), GPU, "emulated-2x2",
                             "x").profile)
    text = "\n".join(report_lines(cal))
    assert "residuals:" in text and "[override]" in text and "[class default]" in text


def test_gemm_faster_than_the_peak_is_an_error() -> None:
    with pytest.raises(PlacerError, match="understates the peak"):
        calibrate_from_bench(_bench(ALPHA, BW, 2 * GPU.bf16_flops), GPU, "c", "x")


def test_one_rank_fits_only_gemm() -> None:
    bench = _bench(ALPHA, BW, 3e10)
    bench["collectives"] = []
    with pytest.raises(PlacerError, match="no collective was measured"):
        calibrate_from_bench(bench, GPU, "c", "x")
    cal = gemm_only(bench, GPU, "c")
    assert cal.profile.intra_node is None and cal.profile.gemm is not None
