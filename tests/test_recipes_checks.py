"""bench/recipes.py's issue-16 checks fail when a #1 breaks them: CP > 2 at <= 8K within the
model's error, eating into the default headroom, a gain over 10 % without a note, a stack rule."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_report_plan import make_candidate

from placer.cost.validity import MODEL_ERROR
from placer.spec import Layout
from placer.spec.job import DEFAULT_MEMORY_HEADROOM
from placer.spec.recipe import published_recipes
from placer.units import GIB

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
recipes = pytest.importorskip("recipes")

RECIPE = next(r for r in published_recipes() if r.id == "nemo2407-llama3-70b-64xh100-fp8")
WHOLE_GPU = 80 * GIB
DEFAULT_CAPACITY = int(WHOLE_GPU * (1 - DEFAULT_MEMORY_HEADROOM))  # 72 GiB of 80


def _outcome(layout: Layout, gain: float, memory_gib: float = 60.0, notes: tuple[str, ...] = (),
             stack_rule: str = "") -> object:
    # capacity_gib 79: the candidate's own capacity is looser than the default headroom's, so
    # the headroom check must use the default, not the job's figure.
    best = make_candidate(layout, memory_gib=memory_gib, capacity_gib=79.0)
    return recipes.Outcome(RECIPE, "yes", True, True, 0.01, "tok/s", "3", best, gain, 1.0, notes,
                           memory=(int(60 * GIB), WHOLE_GPU), default_capacity=DEFAULT_CAPACITY,
                           stack_rule=stack_rule)


def test_a_plain_tie_breaks_nothing() -> None:
    assert _outcome(Layout(tp=4, pp=4, dp=4), 0.05).checks == []


def test_cp4_at_8k_within_the_error_fails_and_beyond_it_passes() -> None:
    assert RECIPE.seq_len == 8192
    cp4 = Layout(tp=4, pp=4, dp=1, cp=4)
    assert _outcome(cp4, MODEL_ERROR / 2).checks == [
        "#1 uses CP > 2 at <= 8K within the model's error"]
    beyond = MODEL_ERROR * 1.1
    assert _outcome(cp4, beyond, notes=("mechanism: CP",)).checks == []
    assert _outcome(Layout(tp=4, pp=4, dp=2, cp=2), MODEL_ERROR / 2).checks == []


def test_a_pick_inside_the_default_headroom_fails() -> None:
    lay = Layout(tp=4, pp=4, dp=4)
    assert _outcome(lay, 0.05, memory_gib=71.9).checks == []
    (only,) = _outcome(lay, 0.05, memory_gib=72.1).checks
    assert only.startswith("#1 eats into the default 10% headroom (72.1 of 72")


def test_a_gain_over_ten_percent_needs_a_note_and_the_stacks_rules() -> None:
    lay = Layout(tp=4, pp=4, dp=4)
    assert _outcome(lay, recipes.GAIN_LIMIT + 0.01).checks == [
        f"#1 {recipes.GAIN_LIMIT + 0.01:+.1%} over the recipe, unexplained"]
    assert _outcome(lay, recipes.GAIN_LIMIT + 0.01, notes=("mechanism: x",)).checks == []
    assert _outcome(lay, 0.05, stack_rule="stack rule r: why").checks == [
        "#1 breaks its stack's rule: stack rule r: why"]


def test_the_mechanism_line_names_the_knobs_and_the_parts_that_drop() -> None:
    recipe = make_candidate(Layout(tp=8, pp=1, dp=32, micro_batch_size=16, recompute="full"),
                            compute_s=11.0, parts={"tp_exposed_s": 4.9, "recompute_s": 3.5})
    best = make_candidate(Layout(tp=4, pp=1, dp=64, micro_batch_size=2, recompute="op"),
                          compute_s=11.6, parts={"tp_exposed_s": 1.4, "recompute_s": 1.3})
    assert recipes._mechanism(best, recipe) == (
        "mechanism: TP 8->4, DP 32->64, mbs 16->2, recompute full->op: exposed TP communication "
        "4.90 -> 1.40 s, recomputation 3.50 -> 1.30 s (step 19.40 -> 14.30 s)")


def test_each_knob_alone_moves_only_that_knob_and_dp_follows() -> None:
    """Llama-3-8B on one DGX H100: the recipe PP2 mbs1 against a #1 PP1 mbs2 ZeRO-2; PP alone is
    the recipe at PP1 with DP 8 (not 4), and an unchanged knob (TP) is not listed."""
    from placer.cost import estimate
    from placer.mesh import DEFAULT_ORDER
    from placer.spec.job import Job
    from placer.spec.presets import cluster_preset, model_preset

    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(1)
    job = Job(seq_len=8192, global_batch_size=64)
    recipe = Layout(tp=1, pp=2, dp=4, micro_batch_size=1, zero_stage=1)
    best = Layout(tp=1, pp=1, dp=8, micro_batch_size=2, zero_stage=2)

    def gain(layout: Layout) -> str:
        base = estimate(model, cluster, job, recipe, order=DEFAULT_ORDER).step_time_s
        step = estimate(model, cluster, job, layout, order=DEFAULT_ORDER).step_time_s
        return f"{base / step - 1:+.1%}"

    mbs = gain(recipe.model_copy(update={"micro_batch_size": 2}))
    zero = gain(recipe.model_copy(update={"zero_stage": 2}))
    pp = gain(recipe.model_copy(update={"pp": 1, "dp": 8}))
    line = recipes._alone(model, cluster, job, recipe, best)
    assert line.replace(", does not fit", "") == (
        f"each alone: mbs 1->2 {mbs}; ZeRO 1->2 {zero}; PP 2->1 {pp}")
