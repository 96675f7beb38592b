"""DeepSpeed's own DeepSpeedConfig accepts every example candidate's deepspeed.json.

At the plan's world size, both ways a job starts DeepSpeed: with an mpu (data-parallel size =
the plan's dp; Megatron-DeepSpeed) and without one (a plain ``deepspeed.initialize``, where
DeepSpeed counts every rank as data-parallel). Both must load, and each rank must run the
plan's micro-batch and accumulation steps; with the mpu the global batch is the plan's. The
gradient dtype DeepSpeed's engine resolves from the file (``get_data_types``) is the one the
plan's memory priced, and DeepSpeed picks an optimizer wrapper for it without refusing; where
the file leaves ``data_types.grad_accum_dtype`` out (fp32 at ZeRO stage 0, which DeepSpeed
refuses with bf16 weights) the README says so. See tests/frameworks/deepspeed_accept.py for the
stubs a CPU-only machine forces.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_frameworks import Case, example_cases, need, run_worker, write_case
from helpers_launch import candidate, plan, small_cluster

from placer.cost.memory import deepspeed_engine_memory
from placer.cost.stack_options import job_options
from placer.dialects import deepspeed
from placer.launch import placement_of
from placer.spec import Job, Layout
from placer.spec.presets import model_preset

# Each starts the framework in its own venv over every example candidate (tests/conftest.py).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return example_cases()


def test_deepspeed_config_with_and_without_mpu(cases: list[Case], tmp_path: Path) -> None:
    version = need("deepspeed")
    manifest = [{"id": c.id, "dir": str(c.folder), "world_size": c.layout.num_gpus,
                 "dp": c.layout.dp, "pp": c.layout.pp}
                for c in cases if "deepspeed.json" in c.written]
    results = run_worker("deepspeed_accept.py", [], manifest, tmp_path)
    checked = 0
    for case in cases:
        layout, job = case.layout, case.plan.job
        if "deepspeed.json" not in case.written:
            # Refused only for DeepSpeed's pipeline-engine rule, with the reason.
            assert layout.pp > 1 and layout.zero_stage >= 2, case.id
            assert any("pipeline engine supports ZeRO stage 0 or 1 only" in r
                       for r in case.refused), case.id
            continue
        got = results[case.id]
        assert "error" not in got, f"{case.id}: {got['error']}"
        micro, steps = layout.micro_batch_size, layout.num_microbatches(job.global_batch_size)
        for way in ("with_mpu", "without_mpu"):
            derived = got[way]
            assert "error" not in derived, f"{case.id} {way}: DeepSpeed: {derived['error']}"
            assert (derived["micro"], derived["accumulation"]) == (micro, steps), case.id
            assert derived["zero_stage"] == layout.zero_stage and derived["bf16"], case.id
        assert got["with_mpu"]["train_batch_size"] == job.global_batch_size, case.id
        assert got["without_mpu"]["world_size"] == layout.num_gpus, case.id
        _check_accumulation(case, got["accumulation"])
        checked += 1
    print(f"deepspeed {version}: {checked} of {len(cases)} candidates accepted both ways")
    assert checked > 0


def _priced_grad_bytes(case: Case) -> int:
    """The bytes per gradient the plan's memory priced: DeepSpeed's wrapper for placer's file on
    the deepspeed stack, the job's optimizer.grad_bytes on the others."""
    job, options = case.plan.job, job_options(case.plan.job)
    if options.deepspeed_engine:
        job = deepspeed_engine_memory(job, case.layout, options)[0]
    return job.optimizer.grad_bytes


def _check_accumulation(case: Case, got: dict[str, object]) -> None:
    assert "error" not in got, f"{case.id}: DeepSpeed refuses the gradient dtype: {got['error']}"
    priced = _priced_grad_bytes(case)
    if got["raw"] is None:  # left out: only fp32 at ZeRO 0, which DeepSpeed refuses (bf16 runs)
        assert (priced, case.layout.zero_stage, got["bytes"]) == (4, 0, 2), case.id
        note = deepspeed.grad_accum_dtype(placement_of(case.plan, case.index))[1]
        assert note is not None and "left out" in note, case.id
    else:
        assert got["bytes"] == priced, (case.id, got, priced)


def test_deepspeed_runs_the_gradient_dtype_the_plan_priced(tmp_path: Path) -> None:
    """Plans on the deepspeed stack (bf16 gradients priced: ZeRO 0 with and without the pipeline
    engine, ZeRO 1) and on megatron-core (fp32 main gradients: ZeRO 1 written, ZeRO 0 left out),
    Llama-3-8B on 2 x 8 GPUs: DeepSpeed's own engine resolves the priced dtype from each file."""
    need("deepspeed")
    m, cluster, cases = model_preset("llama3-8b"), small_cluster(2, 8), []
    for stack, layouts in (("deepspeed", ("pp=2,dp=8", "dp=16", "dp=16,zero=1")),
                           ("megatron-core", ("dp=16,zero=1", "dp=16"))):
        job = Job(name="grad-dtype", seq_len=4096, global_batch_size=64, stack=stack)
        for text in layouts:
            layout = Layout.parse(text)
            p = plan(m, cluster, [candidate(m, cluster, job, layout)], job=job)
            case_id = f"{stack}-{text}"
            cases.append(write_case(tmp_path / case_id, case_id, p))
    manifest = [{"id": c.id, "dir": str(c.folder), "world_size": 16, "dp": c.layout.dp,
                 "pp": c.layout.pp} for c in cases]
    results = run_worker("deepspeed_accept.py", [], manifest, tmp_path)
    for case in cases:
        assert "error" not in results[case.id], results[case.id]
        _check_accumulation(case, results[case.id]["accumulation"])
    raw = {c.id: results[c.id]["accumulation"]["raw"] for c in cases}
    assert raw == {"deepspeed-pp=2,dp=8": "bf16", "deepspeed-dp=16": "bf16",
                   "deepspeed-dp=16,zero=1": "bf16", "megatron-core-dp=16,zero=1": "fp32",
                   "megatron-core-dp=16": None}, raw
