"""torchtitan loads every example candidate's config with its own ConfigManager and builds it.

0.3.x (the latest release): ``torchtitan_config.py`` through ``--module torchtitan_config
--config placer_job``; 0.2.x: ``torchtitan.toml`` through ``--job.config_file``. torchtitan's
``ParallelDims`` and device mesh (fake process group: no GPUs here) must accept the degrees, and
torchtitan's own ``pipeline_llm`` must cut the model into the plan's stages: pp x vpp chunks,
vpp per PP rank, each rank holding the plan's layers. See tests/frameworks/torchtitan_accept.py
for the stubs a CPU-only machine forces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers_frameworks import (
    Case,
    example_cases,
    missing,
    need,
    run_worker,
    torchtitan_toml_path,
    write_case,
)

# Each starts the framework in its own venv over every example candidate (tests/conftest.py).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return example_cases()


def _manifest(cases: list[Case], name: str) -> list[dict[str, Any]]:
    return [{"id": c.id, "dir": str(c.folder), "world_size": c.layout.num_gpus,
             "num_layers": c.plan.model.num_layers} for c in cases if name in c.written]


def _assert_matches_plan(case: Case, got: dict[str, Any], output: str) -> None:
    layout, job = case.layout, case.plan.job
    assert "error" not in got, f"{case.id}: torchtitan rejected it: {got['error']}"
    dims = got["dims"]
    assert (dims["tp"], dims["cp"], dims["pp"], dims["ep"]) == (
        layout.tp, layout.cp, layout.pp, layout.ep), case.id
    assert dims["dp_replicate"] * dims["dp_shard"] == layout.dp, case.id
    # ZeRO >= 1 shards over dp (FSDP); ZeRO-0 replicates (DDP).
    assert dims["dp_shard"] == (layout.dp if layout.zero_stage else 1), case.id
    training = got["training"]
    assert (training["global_batch_size"], training["seq_len"]) == (
        job.global_batch_size, job.seq_len), case.id
    recompute = {"none": ("NoneType", "none"), "selective": ("SelectiveAC.Config", "selective"),
                 "full": ("FullAC.Config", "full"),
                 # op-level SAC: 0.3's SelectiveAC is per-op; 0.2 says selective_ac_option "op"
                 "op": ("SelectiveAC.Config", "selective")}[layout.recompute]
    assert got["activation_checkpoint"] in recompute, case.id
    if layout.pp == 1:
        assert "chunks" not in got
        return
    chunks, ranks = got["chunks"], got["rank_chunks"]
    assert len(chunks) == layout.pp * layout.vpp, case.id
    assert all(len(r) == layout.vpp for r in ranks), case.id
    layers_of_rank = [sum(sum(m.startswith("layers.") for m in chunks[i]) for i in r)
                      for r in ranks]
    assert layers_of_rank == case.stage_layers, case.id
    in_order = [m for c in chunks for m in c if m.startswith("layers.")]
    assert in_order == [f"layers.{i}" for i in range(case.plan.model.num_layers)], case.id
    assert chunks[0][0] == "tok_embeddings" and chunks[-1][-1] == output, case.id
    mbs = got["parallelism"]["pipeline_parallel_microbatch_size"]
    assert mbs == layout.micro_batch_size, case.id
    assert training["local_batch_size"] * layout.dp == job.global_batch_size, case.id


def _compile_cases(root: Path) -> list[Case]:
    """A Llama-3-8B plan on torchtitan@0.2 (which compiles each block and the loss) with
    runtime.torch_compile on: TP2 PP2 FSDP4, op-level recompute, 16 GPUs."""
    from helpers_launch import candidate, plan, small_cluster

    from placer.spec import Job, Layout
    from placer.spec.presets import model_preset

    model, cluster = model_preset("llama3-8b"), small_cluster(2, 8)
    job = Job(name="compile-test", seq_len=4096, global_batch_size=64, stack="torchtitan@0.2",
              runtime={"torch_compile": True})
    layout = Layout(tp=2, pp=2, dp=4, zero_stage=3, recompute="op", sequence_parallel=True)
    compiled = plan(model, cluster, [candidate(model, cluster, job, layout)], job=job)
    return [write_case(root / "compile", "compile#0", compiled)]


@pytest.mark.parametrize("kind", ["py", "toml"])
def test_torchtitan_takes_the_compile_setting(kind: str, tmp_path: Path) -> None:
    """torchtitan's own ConfigManager reads the knob as compile.enable with the components
    placer priced (torchtitan/config/configs.py CompileConfig; 0.2's job_config.py Compile)."""
    pythonpath = ""
    if kind == "toml":
        path = torchtitan_toml_path()
        if path is None:
            missing("no torchtitan 0.2.x target directory")
        pythonpath = str(path)
    need("torchtitan", pythonpath)
    name = "torchtitan_config.py" if kind == "py" else "torchtitan.toml"
    cases = _compile_cases(tmp_path)
    assert name in cases[0].written, cases[0].refused
    got = run_worker("torchtitan_accept.py", [kind], _manifest(cases, name), tmp_path,
                     pythonpath=pythonpath)["compile#0"]
    _assert_matches_plan(cases[0], got, "lm_head" if kind == "py" else "output")
    assert got["compile"] == {"enable": True, "components": ["model", "loss"]}


def _refusals_are_named(cases: list[Case], name: str) -> None:
    for case in cases:
        if name not in case.written:
            assert any(line.startswith(f"{name} not written: torchtitan") for line in
                       case.refused), case.id


def test_torchtitan_03_python_config(cases: list[Case], tmp_path: Path) -> None:
    version = need("torchtitan")
    assert version.startswith("0.3"), version
    results = run_worker("torchtitan_accept.py", ["py"], _manifest(cases, "torchtitan_config.py"),
                         tmp_path)
    checked = 0
    for case in cases:
        if "torchtitan_config.py" in case.written:
            _assert_matches_plan(case, results[case.id], "lm_head")
            checked += 1
    _refusals_are_named(cases, "torchtitan_config.py")
    print(f"torchtitan {version}: {checked} of {len(cases)} candidates accepted")
    assert checked >= len(cases) // 2


def test_torchtitan_02_toml(cases: list[Case], tmp_path: Path) -> None:
    path = torchtitan_toml_path()
    if path is None:
        missing("no torchtitan 0.2.x target directory (.ci/run installs it in "
                ".venv-frameworks/torchtitan-0.2, or set PLACER_TORCHTITAN_TOML_PATH)")
    version = need("torchtitan", str(path))
    assert version.startswith("0.2"), version
    results = run_worker("torchtitan_accept.py", ["toml"], _manifest(cases, "torchtitan.toml"),
                         tmp_path, pythonpath=str(path))
    checked = 0
    for case in cases:
        if "torchtitan.toml" in case.written:
            _assert_matches_plan(case, results[case.id], "output")
            # _assert_matches_plan compares the split torchtitan 0.2 builds (chunks, layers per
            # rank, order) with the plan's, whether the TOML states module lists or not.
            checked += 1
    _refusals_are_named(cases, "torchtitan.toml")
    print(f"torchtitan {version}: {checked} of {len(cases)} candidates accepted")
    assert checked >= len(cases) // 2
