"""torchtitan runs the FP8 placer priced: its own config loader and converters take the files.

A plan priced in FP8 used to be written as a BF16 torchtitan job (no converter). Now the 0.2
TOML names torchtitan's registered converters (``[model] converters``, options under
``[quantize.*]``) and torchtitan 0.2.2 builds them (``build_model_converters``: their own
checks of recipe, FSDP float8 all-gather and parallelism run); the 0.3 Python config applies
torchtitan 0.3's converter classes to the base config's model config, and the model config
torchtitan loads then holds Float8Linear / MXFP8Linear layers (and quantised experts for MoE)
with torchao's scaling for the recipe. Recipes a release lacks are refused, with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers_frameworks import Case, missing, need, run_worker, torchtitan_toml_path, write_case

pytestmark = pytest.mark.slow


def _case(root: Path, name: str, model_name: str, layout: dict[str, Any],
          runtime: dict[str, Any], gpu: str = "H100-SXM-80GB",
          stack: str = "torchtitan@0.2") -> Case:
    from helpers_launch import candidate, plan, small_cluster

    from placer.spec import Job, Layout
    from placer.spec.presets import model_preset

    model = model_preset(model_name)
    built = Layout(**layout)
    cluster = small_cluster(max(1, built.num_gpus // 8), min(8, built.num_gpus), gpu=gpu)
    job = Job(name=f"fp8-{name}", seq_len=4096, global_batch_size=64, precision="fp8",
              stack=stack, runtime=runtime)
    fp8_plan = plan(model, cluster, [candidate(model, cluster, job, built)], job=job)
    return write_case(root / name, name, fp8_plan)


DENSE = {"tp": 2, "dp": 4, "zero_stage": 3, "sequence_parallel": True}
MOE = {"tp": 1, "dp": 8, "ep": 8, "zero_stage": 3}


def _toml(case: Case, tmp_path: Path) -> dict[str, Any]:
    path = torchtitan_toml_path()
    if path is None:
        missing("no torchtitan 0.2.x target directory")
    assert need("torchtitan", str(path)).startswith("0.2")
    assert "torchtitan.toml" in case.written, case.refused
    manifest = [{"id": case.id, "dir": str(case.folder), "world_size": case.layout.num_gpus,
                 "num_layers": case.plan.model.num_layers}]
    got = run_worker("torchtitan_accept.py", ["toml"], manifest, tmp_path,
                     pythonpath=str(path))[case.id]
    assert "error" not in got, got["error"]
    return got["converters"]


def _py(case: Case, tmp_path: Path) -> dict[str, Any]:
    assert need("torchtitan").startswith("0.3")
    assert "torchtitan_config.py" in case.written, case.refused
    manifest = [{"id": case.id, "dir": str(case.folder), "world_size": case.layout.num_gpus,
                 "num_layers": case.plan.model.num_layers}]
    got = run_worker("torchtitan_accept.py", ["py"], manifest, tmp_path)[case.id]
    assert "error" not in got, got["error"]
    return got["model_linears"]


def test_02_tensorwise_with_fsdp_float8_all_gather(tmp_path: Path) -> None:
    case = _case(tmp_path, "tensorwise", "llama3-8b", DENSE,
                 {"fp8_recipe": "tensorwise", "fp8_param_gather": True})
    got = _toml(case, tmp_path)
    assert got["names"] == ["quantize.linear.float8"]
    assert got["built"] == ["Float8LinearConverter"]
    # recipe_name unset is torchao's tensorwise scaling, the one FSDP float8 all-gather takes
    assert got["float8_recipe"] is None and got["fsdp_float8_all_gather"] is True


def test_02_rowwise_and_default(tmp_path: Path) -> None:
    rowwise = _toml(_case(tmp_path, "rowwise", "llama3-8b", DENSE, {"fp8_recipe": "rowwise"}),
                    tmp_path)
    assert rowwise["float8_recipe"] == "rowwise" and rowwise["built"] == ["Float8LinearConverter"]
    default = _toml(_case(tmp_path, "default", "llama3-8b", DENSE, {}), tmp_path)
    assert default["float8_recipe"] is None and default["fsdp_float8_all_gather"] is False


def test_02_mxfp8_and_moe(tmp_path: Path) -> None:
    mx = _toml(_case(tmp_path, "mx", "llama3-8b", DENSE, {"fp8_recipe": "mxfp8"}, gpu="B200"),
               tmp_path)
    assert mx["names"] == ["quantize.linear.mx"]
    if mx["import_error"] and "torchao" in mx["import_error"]:
        # torchtitan 0.2.2's mx.py imports torchao's MXLinearConfig, which the torchao this venv
        # pins for torchtitan 0.3 (0.18) no longer has: the names and options are torchtitan's
        # (its ConfigManager parsed them), the converter itself is not built here.
        assert "MXLinearConfig" in mx["import_error"], mx["import_error"]
    else:
        assert mx["built"] == ["MXLinearConverter"], mx
    moe = _toml(_case(tmp_path, "moe", "mixtral-8x7b", MOE, {}), tmp_path)
    assert moe["names"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert moe["built"] == ["Float8LinearConverter", "Float8GroupedMMConverter"]
    assert moe["grouped_fqns"]["float8"] == ["experts"]


def test_02_refusals_name_torchtitans_rule(tmp_path: Path) -> None:
    """torchtitan 0.2.2's float8 MoE prototype asserts pp = cp = 1 (float8.py L193-198), and
    it has no delayed scaling: placer writes no file it would reject, and says why."""
    pp = _case(tmp_path, "moe-pp", "mixtral-8x7b", {**MOE, "pp": 2, "dp": 4, "ep": 4}, {})
    assert "torchtitan.toml" not in pp.written
    assert any("does not yet support pipeline parallelism" in r for r in pp.refused), pp.refused
    delayed = _case(tmp_path, "delayed", "llama3-8b", DENSE, {"fp8_recipe": "delayed"},
                    stack="megatron-core@0.20")
    assert "torchtitan.toml" not in delayed.written
    assert any("has no FP8 recipe delayed" in r for r in delayed.refused), delayed.refused


def test_03_converted_model_config(tmp_path: Path) -> None:
    rowwise = _py(_case(tmp_path, "py-rowwise", "llama3-8b", DENSE, {"fp8_recipe": "rowwise"}),
                  tmp_path)
    # every decoder linear is Float8Linear (5 per layer x 32: 0.3's Llama 3 fuses wqkv, then wo,
    # w1, w2, w3: models/llama3/__init__.py fuse_qkv=True, FusedQKVLinear), the lm_head stays Linear
    assert rowwise.get("Float8Linear.Config") == 5 * 32, rowwise
    assert rowwise.get("Linear.Config") == 1, rowwise
    assert rowwise["float8_granularity"] == "ScalingGranularity.AXISWISE"
    mx = _py(_case(tmp_path, "py-mx", "llama3-8b", DENSE, {"fp8_recipe": "mxfp8"}, gpu="B200"),
             tmp_path)
    assert mx.get("MXFP8Linear.Config") == 5 * 32 and mx.get("Linear.Config") == 1, mx
    tensorwise = _case(tmp_path, "py-tensorwise", "llama3-8b", DENSE,
                       {"fp8_recipe": "tensorwise"}, stack="megatron-core@0.20")
    assert "torchtitan_config.py" not in tensorwise.written
    assert any("has no FP8 recipe tensorwise" in r for r in tensorwise.refused)


def test_03_moe_experts_are_quantised(tmp_path: Path) -> None:
    """DeepSeek-V3 on its torchtitan 0.3 base config: the float8 converters swap the dense
    linears and the routed experts (GroupedExperts) for their float8 classes."""
    got = _py(_case(tmp_path, "py-moe", "deepseek-v3", MOE, {"fp8_recipe": "rowwise"}), tmp_path)
    experts = {k: v for k, v in got.items() if "Experts" in k}
    assert experts and all("Float8" in k for k in experts), got
    assert got.get("Float8Linear.Config", 0) > 0, got
