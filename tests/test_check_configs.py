"""torchtitan TOML, DeepSpeed JSON, placer plans and layout files under ``placer check``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_check import DATA, line_of, only, rule_ids, run_check

from placer.check import read_config
from placer.errors import PlacerError

# ----- torchtitan -------------------------------------------------------------------------------


def test_torchtitan_degrees_order_and_model() -> None:
    parsed = read_config(DATA / "torchtitan_llama3_70b.toml")
    assert parsed.kind == "torchtitan" and parsed.order == ("tp", "cp", "dp", "pp")
    assert parsed.settings.tp == 8 and parsed.settings.dp is None  # shard = -1: derived
    assert parsed.settings.zero_stage == 3 and parsed.settings.recompute == "full"
    assert parsed.model_ref == "llama3-70b" and parsed.seq_len == 8192
    assert parsed.lines["tp"] == line_of(DATA / "torchtitan_llama3_70b.toml",
                                         "tensor_parallel_degree")


def test_torchtitan_tp8_on_8_nodes_passes() -> None:
    report = run_check("torchtitan_llama3_70b.toml", nodes=8)
    assert report.exit_code == 0 and report.findings == []
    assert report.configs[0].layout is not None
    assert report.configs[0].layout.startswith("tp=8,pp=1,dp=8,cp=1")
    assert report.configs[0].model == "llama3-70b"


def test_torchtitan_tp16_fails_on_the_tp_line() -> None:
    path = DATA / "torchtitan_llama3_8b_tp16.toml"
    found = only(run_check(path, nodes=2), "tp-cross-node")
    assert found.ranks == list(range(16)) and found.line == line_of(path, "tensor_parallel_degree")


def test_torchtitan_explicit_degrees_must_fill_the_world(tmp_path: Path) -> None:
    config = tmp_path / "train.toml"
    config.write_text("[parallelism]\ndata_parallel_shard_degree = 4\n"
                      "tensor_parallel_degree = 8\n")
    found = only(run_check(config, nodes=2), "degrees-cluster")
    assert "tp*pp*dp*cp = 32" in found.message and "16 ranks" in found.message
    assert found.line == 2


def test_torchtitan_replicate_degree_must_divide_dp(tmp_path: Path) -> None:
    config = tmp_path / "hsdp.toml"
    config.write_text("[parallelism]\ndata_parallel_replicate_degree = 3\n"
                      "tensor_parallel_degree = 8\n")
    assert "replicate" in only(run_check(config, nodes=2), "degrees-cluster").message


def test_invalid_toml_is_unreadable(tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text("[parallelism\ntensor_parallel_degree = 8\n")
    report = run_check(config)
    assert report.exit_code == 2 and "invalid TOML" in report.problems[0].message


def test_toml_without_parallelism_is_an_info(tmp_path: Path) -> None:
    config = tmp_path / "ruff.toml"
    config.write_text("line-length = 100\n")
    assert rule_ids(run_check(config)) == ["no-parallel-settings"]


# ----- DeepSpeed --------------------------------------------------------------------------------


def test_deepspeed_zero3_with_model_passes() -> None:
    report = run_check("ds_zero3_llama3_8b.json", model="llama3-8b", seq_len=4096)
    assert report.findings == [] and report.configs[0].num_gpus == 16
    assert report.configs[0].layout is not None and "zero=3" in report.configs[0].layout


def test_deepspeed_autotp_across_nodes_fails() -> None:
    path = DATA / "ds_autotp16.json"
    report = run_check(path, model="llama3-8b", seq_len=4096)
    found = only(report, "tp-cross-node")
    assert found.line == line_of(path, "autotp_size") and report.configs[0].num_gpus == 128


def test_deepspeed_memory_needs_a_sequence_length() -> None:
    report = run_check("ds_zero3_llama3_8b.json", model="llama3-8b")
    assert any("sequence length unknown" in n for n in report.configs[0].notes)


def test_deepspeed_batch_arithmetic_mismatch(tmp_path: Path) -> None:
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_batch_size": 100, "train_micro_batch_size_per_gpu": 8,
                                  "gradient_accumulation_steps": 4,
                                  "zero_optimization": {"stage": 2}}, indent=2))
    found = only(run_check(config, model="llama3-8b"), "degrees-cluster")
    assert "train_batch_size=100" in found.message and found.line == 2


def test_deepspeed_micro_batch_too_big_is_over_memory(tmp_path: Path) -> None:
    data = json.loads((DATA / "ds_zero3_llama3_8b.json").read_text())
    data.update(train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=4)
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(data, indent=2))
    found = only(run_check(config, model="llama3-8b", seq_len=8192), "memory-over-capacity")
    assert "llama3-8b" in found.message and "seq_len=8192" in found.message


# ----- placer plans and layout files ------------------------------------------------------------


def test_plan_candidates_pass() -> None:
    report = run_check("plan_llama3_8b.json", cluster=None)
    assert report.findings == [] and report.exit_code == 0
    assert report.configs[0].kind == "plan" and report.configs[0].cluster == "dgx-h100 x 2 nodes"


def test_plan_rank_map_that_torchrun_would_not_produce() -> None:
    found = only(run_check("plan_torchrun_mismatch.json", cluster=None), "rank-map-torchrun")
    assert found.candidate == 0 and found.ranks == list(range(16)) and found.nodes == [0, 1]
    assert "rank 8 local rank 0" in found.message


def test_plan_with_tp_strided_across_nodes() -> None:
    found = only(run_check("plan_strided_tp.json", cluster=None), "tp-cross-node")
    assert found.ranks == list(range(0, 16, 2)) and "tp-cp-dp-pp" in found.message


def test_plan_whose_memory_does_not_fit() -> None:
    report = run_check("plan_llama3_70b_oom.json", cluster=None)
    found = only(report, "memory-over-capacity")
    assert report.exit_code == 1 and "llama3-70b" in found.message


def test_plan_allowing_tp_outside_nvlink_downgrades_to_warning(tmp_path: Path) -> None:
    data = json.loads((DATA / "plan_strided_tp.json").read_text())
    data["job"]["allow_tp_outside_nvlink"] = True
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    report = run_check(plan, cluster=None)
    assert only(report, "tp-cross-node").severity == "warning" and report.exit_code == 0


@pytest.mark.parametrize("edit, words", [
    (lambda rm: rm[1].update(gpu=rm[0]["gpu"], node=rm[0]["node"]), "both on node"),
    (lambda rm: rm.pop(), "ranks 0..15 once each"),
    (lambda rm: rm[3]["coords"].update(tp=9), "tp coordinate 9"),
    (lambda rm: rm[5].update(gpu=8), "does not have healthy"),
])
def test_plan_rank_map_defects(tmp_path: Path, edit, words: str) -> None:
    data = json.loads((DATA / "plan_llama3_8b.json").read_text())
    data["candidates"] = data["candidates"][:1]
    edit(data["candidates"][0]["rank_map"])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    found = only(run_check(plan, cluster=None), "rank-map-invalid")
    assert words in found.message and found.candidate == 0


def test_plan_with_unknown_field_is_unreadable(tmp_path: Path) -> None:
    data = json.loads((DATA / "plan_llama3_8b.json").read_text())
    data["candidates"][0]["layout"]["tpp"] = 2
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    report = run_check(plan, cluster=None)
    assert report.exit_code == 2 and "unknown field" in report.problems[0].message


def test_layout_file_strided_tp_points_at_the_order_line() -> None:
    path = DATA / "layout_strided_tp.yaml"
    found = only(run_check(path, cluster=None), "tp-cross-node")
    assert found.line == line_of(path, "order:") and found.ranks == list(range(0, 16, 2))


def test_layout_file_memory_over_capacity() -> None:
    found = only(run_check("layout_llama3_70b_oom.yaml", cluster=None), "memory-over-capacity")
    assert found.line == line_of(DATA / "layout_llama3_70b_oom.yaml", "layout:")


def test_layout_file_names_files_relative_to_itself(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text((DATA / "pcie-4x-l40s.yaml").read_text())
    layout = tmp_path / "layout.yaml"
    layout.write_text("layout: tp=4\ncluster: cluster.yaml\nnum_gpus: 8\nmodel: gpt-1.7b\n")
    report = run_check(layout, cluster=None)
    assert report.configs[0].cluster == "pcie-4x-l40s x 2 nodes"
    assert rule_ids(report) == ["tp-pcie-only"]


def test_layout_file_typo_is_unreadable(tmp_path: Path) -> None:
    layout = tmp_path / "layout.yaml"
    layout.write_text("layout: tp=4\nordr: tp-dp\n")
    assert run_check(layout).exit_code == 2


def test_config_without_cluster_needs_the_option() -> None:
    report = run_check("megatron_llama3_8b_tp8.sh", cluster=None)
    assert report.exit_code == 2 and "--cluster" in report.problems[0].message


def test_json_that_is_no_known_kind_is_unreadable(tmp_path: Path) -> None:
    config = tmp_path / "package.json"
    config.write_text('{"name": "x", "version": "1.0"}')
    report = run_check(config)
    assert report.exit_code == 2 and "not a placer plan" in report.problems[0].message


def test_missing_file_is_unreadable_and_others_still_checked() -> None:
    report = run_check("no_such_file.sh", "megatron_llama3_8b_tp16.sh")
    assert report.exit_code == 2 and "no such file" in report.problems[0].message
    assert rule_ids(report) == ["tp-cross-node"]


def test_python_310_without_tomllib_gets_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_tomllib(name: str, *args: object, **kwargs: object) -> object:
        if name == "tomllib":
            raise ModuleNotFoundError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_tomllib)
    with pytest.raises(PlacerError, match="Python 3.11"):
        read_config(DATA / "torchtitan_llama3_70b.toml")


def test_candidate_option_selects_one_plan_candidate(tmp_path: Path) -> None:
    data = json.loads((DATA / "plan_llama3_8b.json").read_text())
    strided = json.loads((DATA / "plan_strided_tp.json").read_text())["candidates"][0]
    data["candidates"].append(strided)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    assert only(run_check(plan, cluster=None), "tp-cross-node").candidate == 2
    assert run_check(plan, cluster=None, candidate=0).findings == []
    assert only(run_check(plan, cluster=None, candidate=2), "tp-cross-node").candidate == 2
    report = run_check(plan, cluster=None, candidate=3)
    assert report.exit_code == 2 and "candidates 0..2" in report.problems[0].message
