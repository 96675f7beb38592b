"""The candidate space: degree tuples and knob options obey the one validation function, the
NVLink rule and the job's constraints, and the counts are exact."""

from __future__ import annotations

import itertools
from pathlib import Path

import placer
from placer.solver.placement import tp_capacity
from placer.solver.space import (
    VPP_CAP,
    Degrees,
    _searched_vpp,
    degree_tuples,
    divisors,
    knob_options,
)
from placer.spec import Job, layout_problem
from placer.spec.presets import cluster_preset, model_preset
from placer.topology import topology_of


def _space(model_name: str, nodes: int, job: Job) -> list[Degrees]:
    model = model_preset(model_name)
    cluster = cluster_preset("dgx-h100").with_nodes(nodes)
    caps = tp_capacity(topology_of(cluster), job, divisors(model.num_attention_heads))
    return degree_tuples(model, job, cluster.num_gpus, caps, exact=True)


def test_divisors_match_trial_division() -> None:
    for n in (1, 2, 12, 97, 100_000, 16_384):
        assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)


def test_degree_tuples_are_exactly_the_valid_base_layouts() -> None:
    job = Job(seq_len=4096, global_batch_size=64)
    model = model_preset("llama3-8b")
    got = set(_space("llama3-8b", 2, job))
    expected = set()
    for tp, pp, cp in itertools.product(divisors(16), repeat=3):
        if 16 % (tp * pp * cp) or tp > 8:
            continue
        degrees = Degrees(tp, pp, 16 // (tp * pp * cp), cp)
        if layout_problem(degrees.layout(), model, job, 16) is None:
            expected.add(degrees)
    assert got == expected
    assert all(d.num_gpus == 16 for d in got)


def test_nvlink_rule_caps_tp_at_the_domain_unless_allowed() -> None:
    strict = _space("llama3-70b", 4, Job(seq_len=4096, global_batch_size=64))
    assert max(d.tp for d in strict) == 8
    loose = _space("llama3-70b", 4, Job(seq_len=4096, global_batch_size=64,
                                        allow_tp_outside_nvlink=True))
    assert max(d.tp for d in loose) == 32


def test_degree_constraints_filter_tuples() -> None:
    job = Job(seq_len=4096, global_batch_size=64, constraints=["tp<=2", "pp in 1,2"])
    got = _space("llama3-8b", 2, job)
    assert got
    assert all(d.tp <= 2 and d.pp in (1, 2) for d in got)


def test_moe_tuples_split_experts_over_the_dense_grid() -> None:
    got = _space("mixtral-8x7b", 2, Job(seq_len=4096, global_batch_size=64))
    assert any(d.ep > 1 for d in got)
    for d in got:
        assert 8 % d.ep == 0 and (d.tp * d.cp * d.dp) % (d.ep * d.etp) == 0 and d.tp % d.etp == 0


def test_knob_options_respect_knob_constraints_and_count_exactly() -> None:
    model = model_preset("llama3-8b")
    job = Job(seq_len=4096, global_batch_size=64,
              constraints=["zero>=1", "recompute in none,full", "sp=on"])
    degrees = Degrees(tp=2, pp=2, dp=4, cp=1)
    options = knob_options(degrees, model, job)
    assert options.vpp_by_mbs[0] == (1, 2, 4, 8, 16)  # 16 layers per stage, 16 micro-batches
    assert options.zero == (1, 2, 3)
    assert options.recompute == ("none", "full")
    assert options.sp == (True,)
    valid = 0
    for mbs, vpps in zip(options.mbs, options.vpp_by_mbs, strict=True):
        for vpp, zero, recompute, sp in itertools.product(vpps, options.zero, options.recompute,
                                                          options.sp):
            layout = degrees.layout(vpp=vpp, mbs=mbs, zero=zero, recompute=recompute, sp=sp)
            assert layout_problem(layout, model, job, 16) is None
            valid += 1
    assert valid == options.count()


def test_named_micro_batch_is_tried_even_off_the_power_of_two_grid() -> None:
    model = model_preset("llama3-8b")
    job = Job(seq_len=4096, global_batch_size=96, constraints=["mbs=3"])
    options = knob_options(Degrees(tp=1, pp=1, dp=16, cp=1), model, job)
    assert options.mbs == (3,)


def test_interleaving_verdicts_shared_across_batches_and_micro_batches_are_exact(
        tmp_path: Path) -> None:
    """knob_options caches each interleaving verdict without the global batch (and, unless a
    stack rule tests ``mbs``, without the micro-batch): asked at three batches in turn, in one
    process, every virtual-stage count it offers passes layout_problem at that batch and every
    one it leaves out (of the counts it tries) fails it; a stack rule on ``mbs`` is obeyed."""
    text = (Path(placer.__file__).parent / "spec" / "presets" / "stacks"
            / "megatron-core@0.20.yaml").read_text(encoding="utf-8")
    assert "\nrules:\n" in text
    stack = tmp_path / "stack.yaml"
    stack.write_text(text.replace("\nrules:\n", "\nrules:\n  - id: no-interleaving-at-mbs-2\n"
                                  "    when: [\"mbs>=2\", \"vpp>1\"]\n    why: \"test rule\"\n"
                                  "    source: \"tests/test_solver_space.py\"\n"),
                     encoding="utf-8")
    model = model_preset("llama3-8b")
    refused = 0
    for stack_ref in (None, str(stack)):
        for batch in (64, 128, 32):
            job = Job(seq_len=4096, global_batch_size=batch, stack=stack_ref)
            for degrees in _space("llama3-8b", 2, job):
                options = knob_options(degrees, model, job)
                for mbs, vpps in zip(options.mbs, options.vpp_by_mbs, strict=True):
                    microbatches = batch // (degrees.dp * mbs)
                    if degrees.pp == 1 or microbatches % degrees.pp:
                        assert vpps == (1,)
                        continue
                    for vpp in range(2, min(VPP_CAP, model.num_layers // degrees.pp) + 1):
                        if not _searched_vpp(model.num_layers, degrees.pp, vpp):
                            continue
                        runs = layout_problem(degrees.layout(vpp=vpp, mbs=mbs), model, job,
                                              16) is None
                        assert (vpp in vpps) == runs, (batch, degrees, mbs, vpp)
                        refused += stack_ref is not None and mbs >= 2 and not runs
    assert refused


def test_degree_tuples_shared_across_batches_are_exact() -> None:
    """degree_tuples caches each (ep, etp) split's verdict without the global batch: asked at
    three batches in turn (DP 16 does not divide 24, so those splits must not come from the
    cache of 64), in one process, the MoE tuples are exactly those whose base layout passes
    layout_problem at that batch."""
    model = model_preset("mixtral-8x7b")
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    for batch in (64, 24, 32):
        job = Job(seq_len=4096, global_batch_size=batch)
        caps = tp_capacity(topology_of(cluster), job, divisors(model.num_attention_heads))
        got = set(degree_tuples(model, job, 16, caps, exact=True))
        expected = set()
        for tp, pp, cp in itertools.product(divisors(16), repeat=3):
            if 16 % (tp * pp * cp) or tp > 8 or pp > model.num_layers:
                continue
            dp = 16 // (tp * pp * cp)
            for ep, etp in itertools.product(divisors(model.moe.num_experts), divisors(tp)):
                degrees = Degrees(tp, pp, dp, cp, ep, etp)
                if (tp * cp * dp) % (ep * etp) == 0 and layout_problem(
                        degrees.layout(), model, job, 16) is None:
                    expected.add(degrees)
        assert got == expected, batch
        assert got and all(batch % d.dp == 0 for d in got)
