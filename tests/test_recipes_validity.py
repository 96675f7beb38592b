"""Published recipes load and run under placer's rules; unvalidated picks must beat a validated
layout by more than the model's measured error to lead."""

from __future__ import annotations

from test_report_plan import make_candidate

from placer.cost.validity import MODEL_ERROR, unvalidated_mechanisms, validated_cp_limit
from placer.solver.prefer import noted, prefer_validated
from placer.spec import Layout
from placer.spec.job import Job
from placer.spec.layout import layout_problem
from placer.spec.presets import model_preset
from placer.spec.recipe import published_recipes
from placer.spec.results import Candidate

JOB_8K = Job(seq_len=8192, global_batch_size=512)


def test_every_published_recipe_is_cited_and_expressible() -> None:
    recipes = published_recipes()
    assert len(recipes) >= 15 and len({r.id for r in recipes}) == len(recipes)
    for recipe in recipes:
        assert recipe.source.url.startswith("https://") and recipe.source.locator
        job = Job(seq_len=recipe.seq_len, global_batch_size=recipe.global_batch_size,
                  precision=recipe.precision)
        layout = recipe.parsed_layout()
        assert layout.num_gpus == recipe.num_gpus, recipe.id
        assert layout_problem(layout, model_preset(recipe.model), job, recipe.num_gpus) is None


def test_cp_chunks_shorter_than_any_measured_run_are_unvalidated() -> None:
    assert unvalidated_mechanisms(Layout(tp=2, cp=4, dp=1), JOB_8K)[0].startswith("CP=4 at 8,192")
    assert unvalidated_mechanisms(Layout(tp=4, cp=2, dp=1), JOB_8K) == []  # NeMo's Llama 3 70B
    assert unvalidated_mechanisms(Layout(cp=8), Job(seq_len=65536, global_batch_size=8)) == []
    assert validated_cp_limit(JOB_8K) == 2 and validated_cp_limit(Job(seq_len=2048,
                                                                      global_batch_size=8)) == 1


def test_an_unvalidated_pick_yields_to_a_validated_one_within_the_error() -> None:
    risky = make_candidate(Layout(tp=2, pp=4, dp=2, cp=4), compute_s=10.0)
    near = 10.0 * (1 + MODEL_ERROR / 2)
    safe = make_candidate(Layout(tp=8, pp=4, dp=2), compute_s=near)
    asked: list[Job] = []

    def search(job: Job) -> list[Candidate]:
        asked.append(job)
        return [safe]

    out, note = prefer_validated([risky], JOB_8K, search, top_k=5)
    assert [c.layout.cp for c in out] == [1, 4] and note
    assert [str(c) for c in asked[0].constraints] == ["cp<=2"]
    assert [line for c in out for line in noted(c, JOB_8K).why
            if line.startswith("unvalidated: relies on CP=")] == [
        next(line for line in noted(risky, JOB_8K).why if line.startswith("unvalidated"))]


def test_an_unvalidated_pick_that_beats_the_error_still_leads() -> None:
    risky = make_candidate(Layout(tp=2, pp=4, dp=2, cp=4), compute_s=10.0)
    slow = make_candidate(Layout(tp=8, pp=4, dp=2), compute_s=10.0 * (1 + 2 * MODEL_ERROR))
    out, note = prefer_validated([risky], JOB_8K, lambda job: [slow], top_k=5)
    assert [c.layout.cp for c in out] == [4, 1] and note

    def no_second_search(job: Job) -> list[Candidate]:
        raise AssertionError("a validated first pick needs no second search")

    assert prefer_validated([slow], JOB_8K, no_second_search, top_k=5) == ([slow], False)


def test_an_unvalidated_pick_behind_a_validated_lead_is_ranked_by_its_penalised_time() -> None:
    """Raw times 10 < 10.5 < 11; CP=4 at 8K is ranked as 10.5 x (1 + error) > 11, so it moves
    behind the validated 11 s pick, and it carries the line saying so."""
    lead = make_candidate(Layout(tp=8, pp=4, dp=2), compute_s=10.0)
    risky = make_candidate(Layout(tp=2, pp=4, dp=2, cp=4), compute_s=10.5)
    mid = make_candidate(Layout(tp=4, pp=4, dp=4), compute_s=11.0)
    assert 10.5 * (1 + MODEL_ERROR) > 11.0

    def no_second_search(job: Job) -> list[Candidate]:
        raise AssertionError("a validated first pick needs no second search")

    assert prefer_validated([lead, risky, mid], JOB_8K, no_second_search, top_k=5) == (
        [lead, mid, risky], True)
