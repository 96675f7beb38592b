"""Fit the cost model's compute-efficiency constants on the calibration set.

A handful of constants are fitted jointly over every measured row of bench/data/published-runs.json
(never row by row). Per GPU die family (profile.constant_family: H200 with H100, GB200 with B200):
the efficiency of fused attention and the fixed time per GEMM kernel (as the GEMM size that
reaches half the ceiling); the ceilings themselves are each GPU's maximum achievable matmul
FLOPS, a microbenchmark (profile.MAMF_EFFICIENCY). Shared by all families, as mechanisms: the
fraction of that ceiling GEMMs sustain inside a training step, element-wise memory traffic per
stored activation byte, the fraction of overlapped communication that overlap hides, the keys
per query at which fused attention reaches half its throughput, and the MoE token dispatcher's
time per routed token copy and per layer (fitted only where MoE rows exist). And the NCCL bus
bandwidth of the one fabric in the set whose measurement the model does not reproduce (Jean
Zay's Omni-Path, used by the BLOOM rows: bench/accuracy.py JEAN_ZAY_NETWORK_BUSBW). A100's
attention follows H100's (profile.ATTENTION_RELATIVE_TO). The loss is the mean absolute log error
of throughput, so a few rows the model cannot describe do not dominate it. A family's attention
figure is fitted only where it has rows that use it; a family without a field uses its
FAMILY_FALLBACK's. Coordinate search over a shrinking grid: deterministic, minutes. A trial
re-costs only the rows whose estimate reads a constant it moves (``predicted_tps``): the same fit
as re-costing every row, in less time.
bench/accuracy.py calls ``fit`` once per held-out source for its leave-one-source-out table.

Prints the fitted values (paste them into placer/cost/profile.py and JEAN_ZAY_NETWORK_BUSBW in
bench/accuracy.py) and the accuracy they give.

    .venv/bin/python bench/fit_compute.py
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy  # noqa: E402

from placer.cost import Calibration  # noqa: E402
from placer.cost.profile import ATTENTION_RELATIVE_TO  # noqa: E402

GLOBALS = ("elementwise_traffic_factor", "overlap_efficiency", "moe_dispatch_s_per_routed_token",
           "attention_half_keys", "moe_dispatch_s_per_layer", "gemm_sustained_fraction",
           "tp_overlap_efficiency", "zero_overlap_efficiency", "moe_host_s_per_layer",
           "moe_host_s_per_expert", "triton_fa_relative")

# (family, field, lower bound, upper bound): "*" for the shared constants, "network" for a
# cluster's network bus bandwidth (Jean Zay: see bench/accuracy.py JEAN_ZAY_NETWORK_BUSBW).
Parameter = tuple[str, str, float, float]
# The rows' predicted tokens/s per GPU under some constants.
Predict = Callable[[list[accuracy.Case], dict[str, Any]], list[float]]
ROUNDS = 8
CYCLES = 6
# Fixed starting point, so the fit does not depend on the constants it is asked to refit.
START = {"elementwise_traffic_factor": 2.0, "overlap_efficiency": 0.8, "network": 5e9,
         "tp_overlap_efficiency": 0.8, "zero_overlap_efficiency": 0.8,
         "moe_dispatch_s_per_routed_token": 0.0, "attention_half_keys": 256.0,
         "moe_dispatch_s_per_layer": 0.0, "gemm_sustained_fraction": 0.9,
         "moe_host_s_per_layer": 0.0, "moe_host_s_per_expert": 0.0, "triton_fa_relative": 1.0,
         "max_efficiency": 0.6, "fp8_max_efficiency": 0.5, "half_efficiency_flops": 1e10,
         "attention_efficiency": 0.5}

# Smallest step scale per constant, in its own unit (a constant fitted from 0 needs one). The
# MoE host launch times price nothing until they exceed a layer's GPU time (compute.pass_times
# takes the longer of the two), so from 0 the search must step into that range at once: the first
# round tries up to half the floor. The fastest MoE forward layers of the set take ~2 ms (Qwen3-30B
# at micro-batch 1 on B200: 2.1 ms over 16 local experts, ~130 us each), so the floors are 5 ms and
# 400 us: at 1 ms and 100 us the first tries (500 us, 50 us per expert) moved no row and the search
# never left 0 (stop 21; tests/test_fit_compute_host.py).
STEP_FLOOR = {"half_efficiency_flops": 1e9, "network": 1e9,
              "moe_dispatch_s_per_routed_token": 1e-8, "attention_half_keys": 64.0,
              "moe_dispatch_s_per_layer": 1e-5, "moe_host_s_per_layer": 5e-3,
              "moe_host_s_per_expert": 4e-4}


def parameters(cases: list[accuracy.Case]) -> list[Parameter]:
    """Only the constants some row exercises: FP8 needs FP8 rows, attention needs fused rows."""
    params: list[Parameter] = [("*", "elementwise_traffic_factor", 0.0, 20.0),
                               ("*", "overlap_efficiency", 0.0, 1.0),
                               ("*", "gemm_sustained_fraction", 0.3, 1.0)]
    # Each overlap mechanism's own efficiency (profile.py), where rows use it: TP collectives
    # pipelined with their GEMMs, ZeRO-2/3 traffic per micro-batch.
    if any(c.options.tp_comm_overlap and c.layout.sequence_parallel and c.layout.tp > 1
           for c in cases):
        params.append(("*", "tp_overlap_efficiency", 0.0, 1.0))
    if any(c.layout.zero_stage >= 2 and not c.layout.zero3_per_step for c in cases):
        params.append(("*", "zero_overlap_efficiency", 0.0, 1.0))
    if any(c.model.moe is not None for c in cases):
        params.append(("*", "moe_dispatch_s_per_routed_token", 0.0, 1e-6))
        params.append(("*", "moe_dispatch_s_per_layer", 0.0, 5e-3))
        params.append(("*", "moe_host_s_per_layer", 0.0, 2e-2))
        params.append(("*", "moe_host_s_per_expert", 0.0, 2e-3))
    if any(c.options.flash_attention for c in cases):
        params.append(("*", "attention_half_keys", 0.0, 8192.0))
    if any(c.options.flash_attention and c.options.attention_kernel == "fa_triton"
           for c in cases):
        params.append(("*", "triton_fa_relative", 0.2, 2.0))
    if any(c.profile is not None for c in cases):
        params.append(("network", "jean-zay", 0.5e9, 12.5e9))
    for family in sorted({c.family for c in cases if not c.oom}):
        rows = [c for c in cases if c.family == family and not c.oom]
        # The large-GEMM ceilings (BF16 and FP8) are each GPU's microbenchmark
        # (profile.MAMF_EFFICIENCY), not fitted; what the rows fit is the fixed time per GEMM
        # kernel and fused attention's efficiency.
        params.append((family, "half_efficiency_flops", 0.0, 1e12))
        # A family whose attention follows another's (profile.ATTENTION_RELATIVE_TO) is not
        # fitted: its rows move the reference family's figure (accuracy.tuned_inputs).
        if (any(c.options.flash_attention for c in rows)
                and family not in ATTENTION_RELATIVE_TO):
            params.append((family, "attention_efficiency", 0.1, 1.0))
    for family, (reference, _) in sorted(ATTENTION_RELATIVE_TO.items()):
        related = [c for c in cases if c.family == family and c.options.flash_attention]
        if related and (reference, "attention_efficiency", 0.1, 1.0) not in params:
            params.append((reference, "attention_efficiency", 0.1, 1.0))
    return params


def initial(params: list[Parameter]) -> dict[str, Any]:
    values: dict[str, Any] = {"gemm": {}, "networks": {}}
    values.update({name: START[name] for name in GLOBALS})
    for family, name, _, _ in params:
        if family == "network":
            values["networks"][name] = START["network"]
        elif family != "*":
            values["gemm"].setdefault(family, {})[name] = START[name]
    return values


def merge(prior: dict[str, Any], fitted: dict[str, Any]) -> dict[str, Any]:
    """``prior`` with every constant ``fitted`` has replaced (fitted wins)."""
    gemm = {f: dict(v) for f, v in prior["gemm"].items()}
    for family, fields in fitted["gemm"].items():
        gemm.setdefault(family, {}).update(fields)
    out: dict[str, Any] = {"gemm": gemm,
                           "networks": {**prior["networks"], **fitted["networks"]}}
    out.update({name: fitted.get(name, prior[name]) for name in GLOBALS})
    return out


def get(values: dict[str, Any], p: Parameter) -> float:
    if p[0] == "*":
        return float(values[p[1]])
    if p[0] == "network":
        return float(values["networks"][p[1]])
    return float(values["gemm"][p[0]][p[1]])


def put(values: dict[str, Any], p: Parameter, value: float) -> dict[str, Any]:
    new: dict[str, Any] = {"gemm": {f: dict(v) for f, v in values["gemm"].items()},
                           "networks": dict(values["networks"])}
    new.update({name: values[name] for name in GLOBALS})
    if p[0] == "*":
        new[p[1]] = value
    elif p[0] == "network":
        new["networks"][p[1]] = value
    else:
        new["gemm"][p[0]][p[1]] = value
    return new


# The Calibration fields accuracy.tune_from sets: every other field is the case's own
# (accuracy.calibration_of), the same in every trial.
TUNED = ("gemm", "profile", *accuracy.TUNED_SCALARS)
_READ: set[str] = set()
_FIELDS = tuple(f.name for f in dataclasses.fields(Calibration))


def _noted(name: str) -> property:
    def read(self: Calibration) -> Any:
        _READ.add(name)
        return self.__dict__[name]

    def write(self: Calibration, value: Any) -> None:  # the dataclass __init__ (replace)
        self.__dict__[name] = value
    return property(read, write)


class _Traced(Calibration):
    """A Calibration that notes which tuned fields an estimate reads (``_READ``); a copy
    (``dataclasses.replace``, ``copy``) is one too."""


for _name in TUNED:
    setattr(_Traced, _name, _noted(_name))


def _traced(calib: Calibration) -> Calibration:
    out = object.__new__(_Traced)
    out.__dict__.update({name: getattr(calib, name) for name in _FIELDS})
    return out


# Per case: the tuned fields each earlier estimate read, and its throughput under the inputs
# (accuracy.tuned_inputs) those fields had. An estimate is a deterministic function of its case
# and its Calibration, so one whose read fields hold the same values reads nothing else and gives
# the same figure: a trial re-costs only the rows that read the constant it moves (a family's
# GEMM fields: that family's rows; the MoE layer terms: MoE rows; TP overlap: overlapped-TP rows).
_READ_SETS: dict[str, list[tuple[str, ...]]] = {}
_PREDICTED: dict[tuple[str, tuple[str, ...], tuple[str, ...]], float] = {}
_CASE_KEYS: dict[str, tuple[str, str | None]] = {}  # record -> (GPU family, profiled cluster)


def predicted_tps(cases: list[accuracy.Case], values: dict[str, Any]) -> list[float]:
    """Each case's predicted tokens/s per GPU under ``values``, re-costed only where a field an
    earlier estimate of that case read now has another value (repr keys: exact for floats)."""
    inputs_for: dict[tuple[str, str | None], tuple[dict[str, Any], dict[str, str]]] = {}
    out = []
    for case in cases:
        rid = case.record_id
        if rid not in _CASE_KEYS:
            _CASE_KEYS[rid] = (case.family,
                               accuracy.network_cluster(accuracy.calibration_of(case)))
        where = _CASE_KEYS[rid]
        if where not in inputs_for:
            inputs = accuracy.tuned_inputs(values, *where)
            inputs_for[where] = (inputs, {name: repr(sorted(value.items()) if name == "gemm"
                                                     else value)
                                          for name, value in inputs.items()})
        inputs, keys = inputs_for[where]
        known = _READ_SETS.setdefault(rid, [])
        tps = None
        for names in known:
            tps = _PREDICTED.get((rid, names, tuple(keys[name] for name in names)))
            if tps is not None:
                break
        if tps is None:
            calib = accuracy.tuned(accuracy.calibration_of(case), inputs)
            traced = _traced(calib)
            _READ.clear()
            tps = accuracy.Outcome(case, accuracy.estimate_case(case, traced)).predicted_tps
            names = tuple(name for name in TUNED if name in _READ)
            if names not in known:
                known.append(names)
            _PREDICTED[(rid, names, tuple(keys[name] for name in names))] = tps
        out.append(tps)
    return out


def loss(cases: list[accuracy.Case], values: dict[str, Any],
         predict: Predict = predicted_tps) -> float:
    predicted = predict(cases, values)
    errors = [abs(math.log(p / c.reported_tps)) for p, c in zip(predicted, cases, strict=True)]
    return sum(errors) / len(errors)


def fit(cases: list[accuracy.Case], rounds: int = ROUNDS, cycles: int = CYCLES,
        predict: Predict = predicted_tps) -> dict[str, Any]:
    """Coordinate search: each constant in turn over a shrinking grid, restarted until the
    restart no longer improves the loss (the constants interact, so one sweep stops early).
    ``predict`` gives the rows' throughputs under some constants (tests pass a plain one)."""
    # A fit's trials rarely meet another fit's (each fold of leave_one_source_out takes its own
    # path): the cache starts empty, so a process running 8 folds holds one fit's estimates.
    _PREDICTED.clear()
    _READ_SETS.clear()
    measured = [c for c in cases if not c.oom]
    params = parameters(measured)
    values = initial(params)
    best = loss(measured, values, predict)
    for _ in range(cycles):
        before = best
        step = 0.5
        for _ in range(rounds):
            for p in params:
                current = get(values, p)
                floor = STEP_FLOOR.get(p[1], STEP_FLOOR["network"] if p[0] == "network" else 0.05)
                scale = max(abs(current), floor)
                for factor in (-1.0, -0.5, -0.25, 0.25, 0.5, 1.0):
                    candidate = min(p[3], max(p[2], current + factor * step * scale))
                    trial = put(values, p, candidate)
                    value = loss(measured, trial, predict)
                    if value < best - 1e-9:
                        best, values, current = value, trial, candidate
            step /= 2
        if best > before - 1e-6:
            break
    return values


def main() -> int:
    cases, skipped, pairs = accuracy.load()
    values = fit(cases)
    print("fitted constants (placer/cost/profile.py; a family without a field borrows its "
          "FAMILY_FALLBACK's):")
    for name in GLOBALS:
        print(f"  {name.upper()} = {values[name]:.3g}")
    for name, busbw in sorted(values["networks"].items()):
        print(f"  network {name}: {busbw:.3g} B/s per GPU (bench/accuracy.py)")
    for family, fields in sorted(values["gemm"].items()):
        text = ", ".join(f"{k}={v:.3g}" for k, v in sorted(fields.items()))
        print(f"  {family}: {text}")
    print()
    outcomes = accuracy.run(cases, accuracy.tune_from(values))
    summary = accuracy.summarize(outcomes, pairs)
    print(f"with these: mean {summary.mean_pct:.1f} %, max {summary.max_pct:.1f} %, pairwise "
          f"{summary.pairwise_right}/{summary.pairwise_total}, OOM caught "
          f"{summary.oom_caught}/{summary.oom_total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
