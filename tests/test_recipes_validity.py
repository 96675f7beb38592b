"""Published recipes load and run under placer's rules; unvalidated picks must beat a validated
layout by more than the model's measured error to lead."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from test_report_plan import make_candidate

from placer.cost.validity import MODEL_ERROR, unvalidated_mechanisms, validated_cp_limit
from placer.solver.prefer import prefer_validated
from placer.spec import Layout
from placer.spec.job import Job
from placer.spec.layout import layout_problem
from placer.spec.presets import model_preset
from placer.spec.recipe import published_recipes

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


@dataclass(frozen=True)
class _Result:
    """What prefer_validated reads of a RecommendResult."""

    candidates: list[Any] = field(default_factory=list)


def _result(*candidates: Any) -> Any:
    return _Result(list(candidates))


def test_an_unvalidated_pick_yields_to_a_validated_one_within_the_error() -> None:
    risky = make_candidate(Layout(tp=2, pp=4, dp=2, cp=4), compute_s=10.0)
    near = 10.0 * (1 + MODEL_ERROR / 2)
    safe = make_candidate(Layout(tp=8, pp=4, dp=2), compute_s=near)
    asked: list[Job] = []

    def search(job: Job) -> Any:
        asked.append(job)
        return _result(safe)

    out = prefer_validated(_result(risky), JOB_8K, search, top_k=5)  # type: ignore[arg-type]
    assert [c.layout.cp for c in out.candidates] == [1, 4]
    assert [str(c) for c in asked[0].constraints] == ["cp<=2"]
    assert any(line.startswith("unvalidated: relies on CP=4") for line in out.candidates[1].why)


def test_an_unvalidated_pick_that_beats_the_error_still_leads() -> None:
    risky = make_candidate(Layout(tp=2, pp=4, dp=2, cp=4), compute_s=10.0)
    slow = make_candidate(Layout(tp=8, pp=4, dp=2), compute_s=10.0 * (1 + 2 * MODEL_ERROR))
    out = prefer_validated(_result(risky), JOB_8K, lambda job: _result(slow),  # type: ignore
                           top_k=5)
    assert [c.layout.cp for c in out.candidates] == [4, 1]
    validated_first = _result(slow, risky)
    assert prefer_validated(validated_first, JOB_8K, lambda job: _result(),  # type: ignore
                            top_k=5) is validated_first
