"""verify --calibrate: refitting the profile from replay measurements."""

from __future__ import annotations

import pytest

from placer.cost.collectives import GroupLink
from placer.spec.profile import LinkProfile
from placer.topology import topology_of
from placer.verify.calibrate import coefficients
from placer.verify.cpu_cluster import emulated_cluster
from placer.verify.feedback import (
    OpSample,
    fit_compute_scale,
    overshooting_notes,
    overshooting_steps,
    profile_class,
    refit_collectives,
    scale_gemm,
)

CLUSTER = emulated_cluster(2, 4, 400)
TOPO = topology_of(CLUSTER)
INTRA = TOPO.group_link([0, 1], concurrent="all")
INTER = TOPO.group_link([0, 4], concurrent="all")
MIXED = TOPO.group_link([0, 1, 4, 5], concurrent="all")
PROFILE = LinkProfile.model_validate({
    "intra_node": {"latency_s": 3e-4, "bandwidth_bytes_per_s": 1e9},
    "inter_node": {"latency_s": 1e-4, "bandwidth_bytes_per_s": 5e7},
    "gemm": {"max_efficiency": 0.2, "half_efficiency_flops": 1e5},
})


def _sample(link: GroupLink, nbytes: int, alpha: float, bandwidth: float,
            candidate: int = 0, collective: str = "all_reduce", dimension: str = "tp"
            ) -> OpSample:
    c1, c2 = coefficients(collective, link.size)
    return OpSample(candidate, collective, dimension, nbytes, link.size, link,
                    c1 * alpha + c2 * nbytes / bandwidth)


def test_link_classes_of_groups() -> None:
    assert profile_class(INTRA) == "intra_node"
    assert profile_class(INTER) == "inter_node"
    assert profile_class(MIXED) is None


def test_two_sizes_refit_both_parameters() -> None:
    ops = [_sample(INTRA, 4096, 6e-4, 5e8, 0), _sample(INTRA, 4 << 20, 6e-4, 5e8, 1)]
    profile, refits, skipped = refit_collectives(PROFILE, ops)
    assert profile.intra_node is not None
    measured = profile.intra_node.for_collective("all_reduce")
    assert measured.latency_s == pytest.approx(6e-4)
    assert measured.bandwidth_bytes_per_s == pytest.approx(5e8)
    assert refits[0].freed == "latency and bandwidth" and refits[0].candidates == (0, 1)
    assert profile.inter_node == PROFILE.inter_node and not skipped


def test_one_size_refits_what_it_is_sensitive_to() -> None:
    # 16 MiB over the network: the bytes term dominates, so only the bandwidth moves.
    big = [_sample(INTER, 16 << 20, 1e-4, 2.5e7)]
    profile, refits, _ = refit_collectives(PROFILE, big)
    assert refits[0].freed == "bandwidth"
    assert profile.inter_node is not None
    assert profile.inter_node.collectives["all_reduce"].bandwidth_bytes_per_s == pytest.approx(
        2.5e7)
    assert profile.inter_node.collectives["all_reduce"].latency_s == 1e-4
    # 4 KiB inside a node: latency-bound, so only the latency moves.
    small = [_sample(INTRA, 4096, 9e-4, 1e9)]
    profile, refits, _ = refit_collectives(PROFILE, small)
    assert refits[0].freed == "latency"
    assert profile.intra_node is not None
    assert profile.intra_node.collectives["all_reduce"].latency_s == pytest.approx(9e-4)


def test_mixed_groups_and_pipeline_receives_are_left_out() -> None:
    ops = [_sample(MIXED, 1 << 20, 1e-4, 5e7, 3),
           _sample(INTER, 1 << 20, 1e-4, 1e6, 4, "send_recv", "pp")]
    profile, refits, skipped = refit_collectives(PROFILE, ops)
    assert not refits and profile == PROFILE
    assert skipped == ("candidate 3: tp all_reduce over 4 ranks spans nodes with several ranks "
                       "per node",)


def test_compute_scale_is_a_least_squares_fit_of_step_times() -> None:
    # measured = rest + 1.5 x compute for every candidate
    steps = [(0.2 + 1.5 * c, 0.2 + c, c) for c in (0.1, 0.3, 0.5)]
    assert fit_compute_scale(steps) == pytest.approx(1.5)
    assert fit_compute_scale([(1.0, 0.5, 0.0)]) is None
    assert fit_compute_scale([(0.1, 2.0, 0.5)]) is None  # communication alone overshoots
    # a candidate whose communication alone overshoots its step is left out, not fitted: with it,
    # the least-squares scale of these four is negative (hand count: -0.079)
    overshoot = (0.15, 4.19, 3.74)  # rest 0.45 s against a 0.15 s step
    assert overshooting_steps([*steps, overshoot]) == [3]
    assert fit_compute_scale([*steps, overshoot]) == pytest.approx(1.5)
    (note,) = overshooting_notes([*steps, overshoot], [0, 1, 2, 7])
    assert note.startswith("compute: candidate 7 left out") and "(0.45 s)" in note
    slower = scale_gemm(PROFILE, 2.0)
    assert slower.gemm is not None and slower.gemm.max_efficiency == pytest.approx(0.1)
    assert slower.gemm.half_efficiency_flops == 1e5
    faster = scale_gemm(PROFILE, 0.1)
    assert faster.gemm is not None and faster.gemm.max_efficiency == 1.0
