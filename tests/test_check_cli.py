"""``placer check`` on the command line: exit codes, the three formats, rule coverage."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from helpers_check import DATA, line_of, run_check
from helpers_cli import cli

from placer.check import RULES, CheckReport

# Every rule id must fire on at least one realistic config below (the "done when").
CORPUS: list[tuple[list[str], dict[str, object]]] = [
    (["megatron_llama3_8b_tp16.sh", "megatron_moe_ep16.sh", "megatron_llama3_8b_cp2.sh",
      "megatron_llama3_70b_64nodes.sh", "megatron_gpt_bad_degrees.sh", "megatron_tp8_pp3.sh",
      "prepare_data.sh", "plan_torchrun_mismatch.json", "plan_llama3_70b_oom.json",
      "megatron_tp_from_argument.sh", "torchtitan_llama3_8b_tp16.toml",
      "torchtitan_qwen3_unknown_flavor.toml"], {}),
    (["megatron_gpt_tp4_pcie.sh"], {"cluster": "pcie-4x-l40s.yaml"}),
    (["megatron_gpt_tp4_nvlink_pairs.sh"], {"cluster": "a100-pcie-nvlink-pairs.yaml"}),
    # ds_zero3_llama3_8b.json at ZeRO stage 0 with fp32 gradient accumulation, which DeepSpeed
    # 0.19 refuses with bf16 (tests/test_deepspeed_optimizer.py runs its own check)
    (["ds_bf16_fp32_accum_stage0.json"], {}),
]


def test_every_rule_is_caught_by_a_realistic_config(tmp_path: Path) -> None:
    seen = set()
    for names, options in CORPUS:
        seen |= {f.rule_id for f in run_check(*names, **options).findings}  # type: ignore[arg-type]
    data = json.loads((DATA / "plan_llama3_8b.json").read_text())
    data["candidates"][0]["rank_map"].pop()
    broken = tmp_path / "plan.json"
    broken.write_text(json.dumps(data))
    seen |= {f.rule_id for f in run_check(broken, cluster=None).findings}
    assert seen == set(RULES)


GOOD = ["megatron_llama3_8b_tp8.sh", "plan_llama3_8b.json", "megatron_moe_ep8.sh"]


def test_good_configs_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["check", *(str(DATA / n) for n in GOOD), "--cluster", "dgx-h100"],
                         capsys)
    assert code == 0 and err == ""
    assert "0 error(s), 0 warning(s)" in out


def test_findings_exit_1_and_text_names_rule_line_and_ranks(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "megatron_llama3_8b_tp16.sh"
    code, out, _ = cli(["check", str(path), "--cluster", "dgx-h100"], capsys)
    line = line_of(path, "--tensor-model-parallel-size")
    assert code == 1
    assert f"error   tp-cross-node (line {line}): TP group of ranks 0-15 spans nodes 0-1" in out


def test_fail_on_warning(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", str(DATA / "megatron_moe_ep16.sh"), "--cluster", "dgx-h100"]
    assert cli(args, capsys)[0] == 0
    assert cli([*args, "--fail-on", "warning"], capsys)[0] == 1


def test_unreadable_input_exits_2_with_one_error_line(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    missing = tmp_path / "gone.sh"
    code, out, err = cli(["check", str(missing), str(DATA / "megatron_llama3_8b_tp16.sh"),
                          "--cluster", "dgx-h100"], capsys)
    assert code == 2
    assert err.strip() == f"error: {missing}: no such file"
    assert "tp-cross-node" in out  # the readable file is still reported


def test_bad_cluster_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(["check", str(DATA / "megatron_llama3_8b_tp8.sh"), "--cluster",
                        "dgx-h999"], capsys)
    assert code == 2 and err.startswith("error: --cluster") and "Traceback" not in err


def test_no_config_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(["check", "--cluster", "dgx-h100"], capsys)
    assert code == 2 and "CONFIG" in err


def test_github_format_annotates_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = DATA / "megatron_moe_ep16.sh"
    tp16 = DATA / "megatron_llama3_8b_tp16.sh"
    code, out, _ = cli(["check", str(tp16), str(path), str(DATA / "prepare_data.sh"),
                        "--cluster", "dgx-h100", "--format", "github"], capsys)
    lines = out.splitlines()
    assert code == 1
    assert lines[0].startswith(f"::error file={tp16},line="
                               f"{line_of(tp16, '--tensor-model-parallel-size')},"
                               "title=tp-cross-node::TP group of ranks 0-15")
    assert lines[1].startswith(f"::warning file={path},line="
                               f"{line_of(path, '--expert-model-parallel-size')},"
                               "title=ep-outside-nvlink::")
    assert lines[2].startswith(f"::notice file={DATA / 'prepare_data.sh'},title="
                               "no-parallel-settings::")
    assert lines[-1].startswith("placer check: 1 error(s), 1 warning(s), 1 info")


def test_github_format_escapes_and_reports_unreadable(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    odd = tmp_path / "a,b:c.sh"
    odd.write_text("torchrun --nproc_per_node 8 --nnodes 2 x.py --tensor-model-parallel-size 16\n")
    code, out, _ = cli(["check", str(odd), str(tmp_path / "missing.toml"), "--cluster",
                        "dgx-h100", "--format", "github"], capsys)
    assert code == 2
    assert f"::error file={tmp_path}/a%2Cb%3Ac.sh,line=1,title=tp-cross-node::" in out
    assert f"::error file={tmp_path}/missing.toml,title=placer check::" in out


def test_json_format_matches_the_report_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["check", str(DATA / "megatron_llama3_8b_tp16.sh"),
                        str(DATA / "plan_torchrun_mismatch.json"), "--cluster", "dgx-h100",
                        "--format", "json"], capsys)
    data = json.loads(out)
    jsonschema.validate(data, CheckReport.model_json_schema())
    assert code == 1 and data["exit_code"] == 1 and data["format"] == "placer-check/1"
    assert [f["rule_id"] for f in data["findings"]] == ["tp-cross-node", "rank-map-torchrun"]
    assert data["findings"][1]["candidate"] == 0
    assert data["counts"] == {"error": 2, "info": 0, "warning": 0}


def test_output_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["check", *(str(p) for p in sorted(DATA.glob("megatron_*.sh"))), "--cluster",
            "dgx-h100", "--format", "json"]
    first = cli(args, capsys)
    assert cli(args, capsys) == first


def test_list_rules(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["check", "--list-rules"], capsys)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(RULES)
    assert "tp-cross-node          error" in out


def test_candidate_option_value(capsys: pytest.CaptureFixture[str]) -> None:
    plan = str(DATA / "plan_torchrun_mismatch.json")
    assert cli(["check", plan, "--candidate", "0"], capsys)[0] == 1
    code, _, err = cli(["check", plan, "--candidate", "best"], capsys)
    assert code == 2 and err.startswith("error: --candidate: 'best' is not valid")


def test_env_and_nodes_options_feed_the_script(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.sh"
    script.write_text("NNODES=${SLURM_NNODES:-1}\ntorchrun --nnodes $NNODES --nproc_per_node 8 "
                      "x.py --tensor-model-parallel-size $TP\n")
    base = ["check", str(script), "--cluster", "dgx-h100"]
    code, out, _ = cli(base, capsys)
    assert code == 0 and "setting-unresolved" in out and "$TP" in out
    code, out, _ = cli([*base, "--env", "TP=16", "--nodes", "2"], capsys)
    assert code == 1 and "tp-cross-node" in out and "(16 GPUs)" in out
    code, _, err = cli([*base, "--env", "TP"], capsys)
    assert code == 2 and "--env" in err
