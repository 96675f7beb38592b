"""``verify --calibrate``: refit the link profile from what the replays measured.

A replay times every communication op under the candidate's real concurrency (two TP groups
sharing one NIC, ranks sharing cores), which the one-group-at-a-time calibration does not see.
Each measured op becomes a point of the same least-squares problem calibrate solves
(``time = c1 x latency + c2 x bytes / bandwidth``, placer/verify/calibrate.py), per profile link
class and collective. A replay usually has one or two sizes per collective, which cannot pin down
two parameters, so the fit frees only what the points are sensitive to: both when their
latency and bandwidth shares differ enough, else the term that dominates them, the other held at
its current value.

Compute is refitted last, from the step times themselves: with the refitted collectives, each
candidate's predicted step is ``a + lambda x c`` (c: the compute on its critical stage), and the
relative least-squares lambda over the candidates rescales the GEMM efficiency. The stand-in's own
call times are not used for this: on CPUs a rank computes faster while the others wait for the
network, so they describe the overlap of ranks more than the GEMMs.

Ops that cannot be attributed to one link class are left out and listed: pipeline receives
(their time includes waiting for the previous stage) and groups that span nodes with several
ranks per node (their time mixes both classes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from placer.cost.collectives import GroupLink
from placer.dims import Part
from placer.spec.profile import GemmProfile, LinkClassProfile, LinkMeasurement, LinkProfile
from placer.verify.calibrate import coefficients
from placer.verify.fit import AlphaBetaFit, TimedPoint, fit_alpha_beta

# Free both parameters only when the points' bandwidth shares (bytes term / predicted time)
# span at least this much; otherwise one term explains them all and the other is unidentified.
MIN_SHARE_SPREAD = 0.3


@dataclass(frozen=True)
class OpSample:
    """One op kind of one candidate: its group, size and measured per-call time."""

    candidate: int
    collective: str
    dimension: str
    message_bytes: int
    group_size: int
    link: GroupLink
    measured_s: float


@dataclass(frozen=True)
class Refit:
    """One refitted (link class, collective) and the points behind it."""

    link_class: str
    collective: str
    freed: str  # "latency and bandwidth", "bandwidth" or "latency"
    before: LinkMeasurement
    fit: AlphaBetaFit
    points: tuple[TimedPoint, ...]
    candidates: tuple[int, ...]


@dataclass(frozen=True)
class Feedback:
    """The refitted profile, what changed and why."""

    profile: LinkProfile
    refits: tuple[Refit, ...]
    compute_scale: float | None
    gemm_before: float | None
    gemm_after: float | None
    skipped: tuple[str, ...]


def profile_class(link: GroupLink) -> str | None:
    """The profile section an op's time measures, or None if it mixes classes."""
    if link.size <= 1:
        return None
    if link.link_class != "network" or link.num_nodes <= 1:
        return "intra_node"
    return "inter_node" if link.max_gpus_per_node == 1 else None


def _section(profile: LinkProfile, name: str) -> LinkClassProfile | None:
    return profile.intra_node if name == "intra_node" else profile.inter_node


def _plain(measurement: LinkMeasurement) -> LinkMeasurement:
    """Just the (latency, bandwidth) pair of a measurement or a class default."""
    return LinkMeasurement(latency_s=measurement.latency_s,
                           bandwidth_bytes_per_s=measurement.bandwidth_bytes_per_s)


def _fit_one(points: Sequence[TimedPoint], before: LinkMeasurement, what: str
             ) -> tuple[AlphaBetaFit, str]:
    shares = []
    for p in points:
        bw_s = p.bytes_coeff / before.bandwidth_bytes_per_s
        shares.append(bw_s / (bw_s + p.latency_coeff * before.latency_s))
    if max(shares) - min(shares) >= MIN_SHARE_SPREAD:
        return fit_alpha_beta(points, what=what), "latency and bandwidth"
    if sorted(shares)[len(shares) // 2] >= 0.5:
        return fit_alpha_beta(points, what=what, latency_s=before.latency_s), "bandwidth"
    return (fit_alpha_beta(points, what=what, bandwidth_bytes_per_s=before.bandwidth_bytes_per_s),
            "latency")


def refit_collectives(profile: LinkProfile, ops: Sequence[OpSample]
                      ) -> tuple[LinkProfile, tuple[Refit, ...], tuple[str, ...]]:
    """A profile whose refitted entries replace the old ones (as per-collective overrides)."""
    grouped: dict[tuple[str, str], list[tuple[OpSample, TimedPoint]]] = {}
    skipped: list[str] = []
    for op in ops:
        if op.dimension == Part.PP:
            continue  # a pipeline receive waits for the previous stage's compute
        name = profile_class(op.link)
        if name is None or _section(profile, name) is None:
            skipped.append(f"candidate {op.candidate}: {op.dimension} {op.collective} over "
                           f"{op.group_size} ranks spans nodes with several ranks per node")
            continue
        c1, c2 = coefficients(op.collective, op.group_size)
        grouped.setdefault((name, op.collective), []).append(
            (op, TimedPoint(op.message_bytes, op.measured_s, c1, c2 * op.message_bytes)))
    refits: list[Refit] = []
    sections: dict[str, LinkClassProfile] = {}
    for name in ("intra_node", "inter_node"):
        section = _section(profile, name)
        if section is None:
            continue
        overrides = dict(section.collectives)
        for (cls, collective), entries in sorted(grouped.items()):
            if cls != name:
                continue
            before = section.for_collective(collective)
            points = tuple(point for _, point in entries)
            fit, freed = _fit_one(points, before, f"replay {name} {collective}")
            refits.append(Refit(name, collective, freed, _plain(before), fit, points,
                                tuple(sorted({op.candidate for op, _ in entries}))))
            overrides[collective] = LinkMeasurement(  # type: ignore[index]
                latency_s=fit.latency_s, bandwidth_bytes_per_s=fit.bandwidth_bytes_per_s)
        sections[name] = section.model_copy(update={"collectives": overrides})
    updated = LinkProfile.model_validate(profile.model_copy(update=sections).model_dump())
    return updated, tuple(refits), tuple(dict.fromkeys(skipped))


def overshooting_steps(steps: Sequence[tuple[float, float, float]]) -> list[int]:
    """Indices of the (measured m, predicted a + c, compute c) steps whose predicted time besides
    compute, a, already reaches m: no positive compute scale explains them (their link profile
    overstates the communication), so ``fit_compute_scale`` leaves them out."""
    return [i for i, (measured, predicted, compute) in enumerate(steps)
            if predicted - compute >= measured]


def overshooting_notes(steps: Sequence[tuple[float, float, float]],
                       candidates: Sequence[int]) -> tuple[str, ...]:
    """One line per step ``fit_compute_scale`` leaves out, naming its candidate (``candidates``
    holds each step's candidate index), for a Feedback's skipped list."""
    return tuple(
        f"compute: candidate {candidates[i]} left out of the compute fit: its predicted time "
        f"besides compute ({steps[i][1] - steps[i][2]:.3g} s) reaches its measured step "
        f"({steps[i][0]:.3g} s); the link profile overstates its communication"
        for i in overshooting_steps(steps))


def fit_compute_scale(steps: Sequence[tuple[float, float, float]]) -> float | None:
    """lambda minimising sum(((a + lambda c) - m) / m)^2 over (measured m, predicted a + c, c),
    over the steps a compute scale can explain (not ``overshooting_steps``).

    Left in, one candidate whose predicted communication alone exceeds its measured step pulls
    lambda negative for all (seen on a fast CPU, where an emulated profile's FSDP gathers were
    predicted at 0.45 s against a 0.15 s step). None when no step is left with compute on its
    critical stage.
    """
    num = den = 0.0
    left_out = set(overshooting_steps(steps))
    for i, (measured, predicted, compute) in enumerate(steps):
        if i in left_out:
            continue
        rest = predicted - compute
        num += compute * (measured - rest) / measured**2
        den += compute**2 / measured**2
    if den <= 0 or num <= 0:
        return None
    return num / den


def scale_gemm(profile: LinkProfile, scale: float) -> LinkProfile:
    """GEMMs ``scale`` times slower: efficiency divided by it (capped at 1)."""
    if profile.gemm is None:
        return profile
    gemm = GemmProfile(**{**profile.gemm.model_dump(),
                          "max_efficiency": min(1.0, profile.gemm.max_efficiency / scale)})
    return profile.model_copy(update={"gemm": gemm})
