"""Replay programs: what each rank runs, and the simulation that predicts its step time."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from placer.cli.launch_command import load_plan
from placer.cost import calibration_for
from placer.errors import PlacerError
from placer.spec import Layout
from placer.spec.profile import load_link_profile
from placer.verify.replay import (
    LayerOps,
    OpKind,
    ReplayProgram,
    gemm_call_s,
    repredict,
    simulate,
    stage_program,
)
from placer.verify.session import Prepared, prepare

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "emulated-2x2"
PIPELINE = Layout(pp=2)


@pytest.fixture(scope="module")
def prepared() -> list[Prepared]:
    plan = load_plan(EXAMPLE / "plan.json")
    profile = load_link_profile(EXAMPLE / "profile.yaml")
    return prepare(plan, range(len(plan.candidates)), profile, 1.0)


def _ops(program: ReplayProgram, stage: int) -> Counter[tuple[str, str]]:
    """(op letter, dimension or 'gemm') counts of one stage's program."""
    counts: Counter[tuple[str, str]] = Counter()
    for name, arg in program.stages[stage]:
        counts[(name, "gemm" if name == "g" else program.kinds[arg].dimension)] += (
            arg if name == "g" else 1)
    return counts


def test_programs_issue_exactly_the_estimates_collectives(prepared: list[Prepared]) -> None:
    for prep in prepared:
        prog, est = prep.program, prep.estimate
        m = prep.placement.layout.num_microbatches(prep.placement.plan.job.global_batch_size)
        assert prog.microbatches == m
        for stage in range(prep.placement.layout.pp):
            counts = _ops(prog, stage)
            for row in est.collectives:
                if row.dimension in ("tp", "dp"):
                    assert counts[("c", row.dimension)] == row.calls_per_step
            if prep.placement.layout.pp == 2:
                sends = ("s", "pp") if stage == 0 else ("S", "pp")
                recvs = ("R", "pp") if stage == 0 else ("r", "pp")
                assert counts[sends] == m and counts[recvs] == m
            # The stand-in does the predicted compute time in whole GEMM calls.
            compute = (est.breakdown.compute_s + est.breakdown.recompute_s) * prog.scale
            assert counts[("g", "gemm")] * prog.gemm_call_s == pytest.approx(compute, rel=0.15)
        sizes = {k.dimension: k.message_bytes for k in prog.kinds}
        for row in est.collectives:
            if row.dimension != "pp":
                assert sizes[row.dimension] == pytest.approx(row.message_bytes, rel=1e-3)


def test_scale_shrinks_every_size(prepared: list[Prepared]) -> None:
    plan = prepared[0].placement.plan
    profile = load_link_profile(EXAMPLE / "profile.yaml")
    half = prepare(plan, [1], profile, 0.5)[0].program
    full = prepared[1].program
    for a, b in zip(full.kinds, half.kinds, strict=True):
        assert b.message_bytes == pytest.approx(a.message_bytes / 2, rel=1e-3)
    assert half.predicted_step_s < full.predicted_step_s
    with pytest.raises(PlacerError, match="--scale"):
        prepare(plan, [0], profile, 0.0)


def test_pipeline_less_step_is_the_sum_of_its_ops(prepared: list[Prepared]) -> None:
    for prep in prepared:
        prog = prep.program
        if prep.placement.layout.pp > 1:
            continue
        total = sum(arg * prog.gemm_call_s if name == "g" else prog.kinds[arg].time_s
                    for name, arg in prog.stages[0])
        assert prog.predicted_step_s == pytest.approx(total)
        calib = calibration_for(prep.placement.plan.cluster,
                                load_link_profile(EXAMPLE / "profile.yaml"))
        again, _ = repredict(prog, calib, "bf16")
        assert again == pytest.approx(prog.predicted_step_s)
        json.dumps(prog.document())


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (4, 8), (3, 2)])
def test_1f1b_simulation_matches_the_closed_form(stages: int, microbatches: int) -> None:
    """Even stages, free sends: (m + p - 1) x (forward + backward) (Narayanan et al. 2021)."""
    grid = [[LayerOps()] for _ in range(microbatches)]
    link = OpKind(0, "pp", "send_recv", 1024, 2, "pp", "network", 0.0)
    programs = tuple(tuple(stage_program(s, stages, microbatches, grid, 1, 2, [], [], [], 0, 0))
                     for s in range(stages))
    prog = ReplayProgram(layout=PIPELINE, scale=1.0, microbatches=microbatches,
                         layers=1, kinds=(link,), stages=programs, gemm_n=64, gemm_call_s=1.0,
                         predicted_step_s=0.0)
    step, parts = simulate(prog, [0.0], 1.0)
    assert step == pytest.approx((microbatches + stages - 1) * 3.0)
    assert parts["compute"] == pytest.approx(microbatches * 3.0)
    # A transfer time on each hop delays the pipeline's fill and drain.
    slower, _ = simulate(prog, [0.5], 1.0)
    assert slower > step


def test_a_receive_without_a_send_is_a_deadlock() -> None:
    link = OpKind(0, "pp", "send_recv", 1024, 2, "pp", "network", 0.1)
    prog = ReplayProgram(layout=PIPELINE, scale=1.0, microbatches=1, layers=1,
                         kinds=(link,), stages=((("R", 0),), (("r", 0),)), gemm_n=64,
                         gemm_call_s=1.0, predicted_step_s=0.0)
    with pytest.raises(PlacerError, match="deadlock"):
        simulate(prog, [0.1], 1.0)


def test_gemm_call_time_is_the_cost_models() -> None:
    profile = load_link_profile(EXAMPLE / "profile.yaml")
    plan = load_plan(EXAMPLE / "plan.json")
    calib = calibration_for(plan.cluster, profile)
    assert profile.gemm is not None
    flops = 2.0 * 256**3
    expected = (flops + (profile.gemm.half_efficiency_flops or 0.0)) / (
        plan.cluster.node_types[0].gpu.bf16_flops * profile.gemm.max_efficiency)
    assert gemm_call_s(256, calib, "bf16") == pytest.approx(expected)


def test_the_replay_runs_dense_and_expert_gradient_reductions_on_their_groups() -> None:
    # Mixtral 8x7B, tp=2, dp=8, ep=4: the dense all-reduce on the 8-rank dp x cp group and the
    # expert one on the 4-rank expert data-parallel group are both in the program.
    from placer.cost import estimate
    from placer.cost.groups import group_links
    from placer.dims import DEFAULT_ORDER, Group
    from placer.spec import Job
    from placer.spec.presets import cluster_preset, model_preset
    from placer.verify.replay import build_program

    model, job = model_preset("mixtral-8x7b"), Job(seq_len=4096, global_batch_size=64)
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    layout = Layout.parse("tp=2,dp=8,ep=4,zero=0")
    est = estimate(model, cluster, job, layout)
    links = group_links(cluster, layout, DEFAULT_ORDER, None)
    program = build_program(est, model, job, links, calibration_for(cluster), 0.01, 256)
    ends = Counter((program.kinds[arg].group, program.kinds[arg].group_size)
                   for name, arg in program.stages[0] if name == "c"
                   and program.kinds[arg].dimension == "dp")
    assert ends == {(Group.DP_CP, 8): 1, (Group.EDP, 4): 1}
    documented = {(k["group"], k["group_size"]) for k in program.document()["kinds"]
                  if k["dimension"] == "dp"}
    assert documented == {("dp_cp", 8), ("edp", 4)}
