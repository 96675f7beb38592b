"""DeepSpeed's own DeepSpeedConfig accepts every example candidate's deepspeed.json.

At the plan's world size, both ways a job starts DeepSpeed: with an mpu (data-parallel size =
the plan's dp; Megatron-DeepSpeed) and without one (a plain ``deepspeed.initialize``, where
DeepSpeed counts every rank as data-parallel). Both must load, and each rank must run the
plan's micro-batch and accumulation steps; with the mpu the global batch is the plan's. See
tests/frameworks/deepspeed_accept.py for the stubs a CPU-only machine forces.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_frameworks import Case, example_cases, need, run_worker

# Each starts the framework in its own venv over every example candidate (tests/conftest.py).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return example_cases()


def test_deepspeed_config_with_and_without_mpu(cases: list[Case], tmp_path: Path) -> None:
    version = need("deepspeed")
    manifest = [{"id": c.id, "dir": str(c.folder), "world_size": c.layout.num_gpus,
                 "dp": c.layout.dp} for c in cases if "deepspeed.json" in c.written]
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
        checked += 1
    print(f"deepspeed {version}: {checked} of {len(cases)} candidates accepted both ways")
    assert checked > 0
