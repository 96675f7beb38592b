"""The plan file: defaults, assembly and the stable JSON that --json, --emit and examples share.

Candidates are built by hand here so these tests pin the report layer alone; the end-to-end
tests (test_recommend_*.py) run the real solver and cost model.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from placer.dims import DEFAULT_ORDER
from placer.errors import InputError, PlacerError
from placer.mesh import MeshGrid
from placer.report.defaults import (
    default_global_batch,
    default_seq_len,
    resolve_job,
    resolve_nodes,
)
from placer.report.plan import build_plan, plan_json
from placer.spec import Candidate, Layout, Plan
from placer.spec.presets import cluster_preset, model_preset
from placer.spec.results import MemoryBreakdown, RankEntry, SearchStats, StepBreakdown

GIB = 2**30


def make_candidate(layout: Layout, *, gpus_per_node: int = 8, compute_s: float = 10.0,
                   parts: dict[str, float] | None = None, memory_gib: float = 60.0,
                   capacity_gib: float = 75.0, links: dict[str, str] | None = None,
                   order: tuple[str, ...] = DEFAULT_ORDER, why: list[str] | None = None,
                   skip_slots: frozenset[tuple[int, int]] = frozenset()) -> Candidate:
    """A hand-made candidate whose numbers are consistent (parts add up to the step)."""
    fields: dict[str, float] = {f: 0.0 for f in StepBreakdown.model_fields}
    fields["compute_s"] = compute_s
    fields.update(parts or {})
    step = sum(fields.values())
    grid = MeshGrid(layout, order)
    slots = [(n, g) for n in range(10_000) for g in range(gpus_per_node)
             if (n, g) not in skip_slots][: layout.num_gpus]
    rank_map = [RankEntry(rank=i, node=slots[i][0], local_rank=slots[i][1], gpu=slots[i][1],
                          coords=grid.coords(i)) for i in range(layout.num_gpus)]
    total = int(memory_gib * GIB)
    memory = MemoryBreakdown(weights_bytes=total // 4, gradients_bytes=total // 4,
                             optimizer_bytes=total // 4, activations_bytes=total - 3 * (total // 4),
                             logits_bytes=0, moe_buffers_bytes=0, framework_bytes=0,
                             fragmentation_bytes=0, total_bytes=total,
                             capacity_bytes=int(capacity_gib * GIB), worst_stage=0)
    tokens = 512 * 8192
    return Candidate(layout=layout, mesh_order=list(order), step_time_s=step,
                     tokens_per_s=tokens / step, tflops_per_gpu=400.0 * compute_s / step,
                     hardware_tflops_per_gpu=420.0 * compute_s / step,
                     mfu=0.4 * compute_s / step, hfu=0.42 * compute_s / step,
                     peak_memory_bytes=total, fits=memory_gib <= capacity_gib,
                     breakdown=StepBreakdown(**fields), memory=memory, collectives=[],
                     links=links or {"tp": "nvlink", "pp": "network", "dp": "network"},
                     rank_map=rank_map, why=why or [])


def small_plan(**kwargs: Any) -> Plan:
    model = model_preset("llama3-70b")
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    job, used = resolve_job(model, seq_len=None, global_batch=None)
    first = make_candidate(Layout(tp=8, pp=2, dp=1, micro_batch_size=1, zero_stage=0,
                                  recompute="selective", sequence_parallel=True))
    second = make_candidate(Layout(tp=4, pp=4, dp=1, recompute="full"), compute_s=10.0,
                            parts={"recompute_s": 2.0})
    stats = SearchStats(layouts_considered=120, layouts_feasible=7, solver_status="OPTIMAL",
                        wall_s=kwargs.pop("wall_s", 0.731))
    return build_plan(model, cluster, job, [first, second], stats=stats, defaults_used=used,
                      explanation=["Best: because."])


def test_default_seq_len_caps_at_8k_and_falls_back_for_models_without_a_limit() -> None:
    assert default_seq_len(model_preset("llama3-70b")) == 8192
    assert default_seq_len(model_preset("gpt3-175b")) == 2048
    no_limit = model_preset("llama2-7b").model_copy(update={"max_seq_len": None})
    assert default_seq_len(no_limit) == 4096


@pytest.mark.parametrize(("seq_len", "batch"), [(8192, 512), (2048, 2048), (4096, 1024),
                                                 (131072, 32), (3000, 1024), (2**23, 1)])
def test_default_global_batch_is_the_power_of_two_nearest_4m_tokens(seq_len: int,
                                                                    batch: int) -> None:
    assert default_global_batch(seq_len) == batch


def test_resolve_job_reports_each_default_and_the_flag_that_sets_it() -> None:
    job, used = resolve_job(model_preset("llama3-70b"), seq_len=None, global_batch=None)
    assert (job.seq_len, job.global_batch_size) == (8192, 512)
    assert len(used) == 4
    assert "--seq-len" in used[0] and "131,072 capped" in used[0]
    assert "--global-batch" in used[1] and "4,194,304 tokens" in used[1]
    assert "--stack" in used[2] and job.stack is not None and used[2].startswith(
        f"stack={job.stack} ")
    assert "expandable segments" in used[3] and "runtime.expandable_segments: false" in used[3]
    job, used = resolve_job(model_preset("llama3-70b"), seq_len=4096, global_batch=64,
                            constraints=("tp<=4", "pp in 2,4"))
    assert [line.split(" ")[0] for line in used] == [f"stack={job.stack}", "allocator"]
    assert job.global_batch_size == 64
    assert [str(c) for c in job.constraints] == ["tp<=4", "pp in 2,4"]


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"seq_len": 0, "global_batch": None}, "--seq-len"),
    ({"seq_len": None, "global_batch": -4}, "--global-batch"),
    ({"seq_len": None, "global_batch": None, "constraints": ("tp<<8",)}, "--constraint"),
])
def test_resolve_job_rejects_bad_flags_with_one_line(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(PlacerError) as err:
        resolve_job(model_preset("llama3-70b"), **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_resolve_nodes_scales_presets_and_names_the_default() -> None:
    preset = cluster_preset("dgx-h100")
    scaled, used = resolve_nodes(preset, 8, is_preset=True)
    assert scaled.num_gpus == 64 and used == []
    same, used = resolve_nodes(preset, None, is_preset=True)
    assert same.num_nodes == 1 and "--nodes" in used[0]
    assert resolve_nodes(preset, None, is_preset=False)[1] == []
    with pytest.raises(InputError):
        resolve_nodes(preset, 0, is_preset=True)


def test_plan_json_is_valid_against_the_published_schema() -> None:
    data = json.loads(plan_json(small_plan()))
    jsonschema.validate(data, Plan.model_json_schema())
    assert data["format"] == "placer-plan/1"
    first = data["candidates"][0]
    for key in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch_size", "zero_stage",
                "recompute", "sequence_parallel"):
        assert key in first["layout"]
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_bytes",
                "fits", "breakdown", "rank_map"):
        assert key in first
    assert len(first["rank_map"]) == 16


def test_plan_json_is_byte_stable_and_ignores_search_wall_time() -> None:
    a, b = plan_json(small_plan(wall_s=0.1)), plan_json(small_plan(wall_s=9.9))
    assert a == b
    assert json.loads(a)["search"]["wall_s"] == 0.0
    assert json.loads(a)["search"]["layouts_considered"] == 120


def test_plan_json_round_trips_and_keeps_rank_entries_on_one_line() -> None:
    plan = small_plan()
    text = plan_json(plan)
    again = Plan.model_validate_json(text)
    assert again.candidates == plan.candidates
    assert again.job == plan.job and again.cluster == plan.cluster
    rank_lines = [line for line in text.splitlines() if '"coords"' in line and '"rank"' in line]
    assert len(rank_lines) == 32  # 16 ranks x 2 candidates, one line each
    # Rank entries spread one field a line would add ~5 lines each (160 here); the rest of the
    # plan (inputs and two candidates with every layout and job field) is about 250 lines.
    assert len(text.splitlines()) < 320
    assert text.endswith("}\n")
