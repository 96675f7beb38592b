"""Megatron-LM launch scripts: the bash subset, flags, world size, model, and the rules on them."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_check import DATA, line_of, only, rule_ids, run_check

from placer.check import read_config
from placer.check.parse_megatron import parse_megatron
from placer.errors import PlacerError


def parse(text: str, name: str = "train.sh"):
    return parse_megatron(Path(name), text)


# ----- the bash subset ------------------------------------------------------------------------


def test_variables_are_read_in_script_order() -> None:
    parsed = parse("TP=2\nA=(--tensor-model-parallel-size $TP)\nTP=8\ntorchrun x.py ${A[@]}\n")
    assert parsed.settings.tp == 2
    # an array that no command expands launches nothing...
    parsed = parse("A=(--tensor-model-parallel-size 8)\ntorchrun x.py --pipeline-model-"
                   "parallel-size 2\n")
    assert (parsed.settings.tp, parsed.settings.pp) == (1, 2)
    # ...unless no command uses any flag: an argument file to be sourced (megatron_args.sh)
    parsed = parse("A=(--tensor-model-parallel-size 8)\n")
    assert parsed.settings.tp == 8 and any("argument file" in n for n in parsed.notes)


def test_flag_forms_last_occurrence_wins_and_lines() -> None:
    parsed = parse("python pretrain_gpt.py \\\n"
                   "  --tensor-model-parallel-size=2 \\\n"
                   "  --pipeline-model-parallel-size 4 \\\n"
                   "  --tensor-model-parallel-size 8\n")
    assert parsed.settings.tp == 8 and parsed.settings.pp == 4
    assert parsed.lines["tp"] == 4 and parsed.lines["pp"] == 3


def test_plain_argument_list_file() -> None:
    parsed = parse("--tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 "
                   "--sequence-parallel --use-tp-pp-dp-mapping", "args.txt")
    assert (parsed.settings.tp, parsed.settings.pp) == (4, 2)
    assert parsed.settings.sequence_parallel is True
    assert parsed.order == ("tp", "cp", "pp", "dp")


def test_default_order_is_megatrons() -> None:
    assert parse("--tensor-model-parallel-size 8").order == ("tp", "cp", "dp", "pp")


def test_unresolvable_degree_is_reported_not_guessed() -> None:
    parsed = parse("TP=$(nvidia-smi -L | wc -l)\ntorchrun x.py --tensor-model-parallel-size $TP\n")
    assert parsed.unresolved["tp"].startswith(
        "line 2: --tensor-model-parallel-size takes its value from $TP")
    with pytest.raises(PlacerError, match="is not a positive integer"):
        parse("--pipeline-model-parallel-size two\n")


def test_unresolvable_model_flag_is_a_note_not_an_error() -> None:
    parsed = parse("--num-layers $LAYERS --tensor-model-parallel-size 2\n")
    assert parsed.settings.tp == 2 and parsed.model is None
    assert "--num-layers takes its value from $LAYERS" in (parsed.model_problem or "")


# ----- world size and model -------------------------------------------------------------------


def test_world_size_from_torchrun_flags_over_variables() -> None:
    parsed = read_config(DATA / "megatron_llama3_8b_tp8.sh")
    assert (parsed.nproc_per_node, parsed.world_size) == (8, 16)
    standalone = parse("torchrun --standalone --nproc-per-node 4 x.py")
    assert standalone.world_size == 4
    variables = parse("GPUS_PER_NODE=8\nNNODES=4\npython x.py --tensor-model-parallel-size 8")
    assert variables.world_size == 32
    world_only = parse("WORLD_SIZE=24\npython x.py --tensor-model-parallel-size 8")
    assert (world_only.world_size, world_only.nproc_per_node) == (24, None)
    elastic = parse("torchrun --nnodes 2:4 --nproc_per_node gpu x.py")
    assert elastic.nproc_per_node is None


def test_model_from_script_flags() -> None:
    parsed = read_config(DATA / "megatron_llama3_8b_tp8.sh")
    model = parsed.model
    assert model is not None
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (32, 4096, 32)
    assert (model.kv_heads, model.ffn_hidden_size, model.vocab_size) == (8, 14336, 128256)
    assert model.gated_mlp and not model.tied_embeddings and model.moe is None
    assert (parsed.seq_len, parsed.global_batch_size) == (8192, 128)
    assert parsed.settings.zero_stage == 1 and parsed.settings.recompute == "selective"


def test_model_defaults_follow_megatron() -> None:
    model = parse("--num-layers 24 --hidden-size 2304 --num-attention-heads 24 --swiglu").model
    assert model is not None
    # SwiGLU default FFN: 2/3 of 4h rounded down to a multiple of 64 (arguments.py)
    assert model.ffn_hidden_size == int(4 * 2304 * 2 / 3 / 64) * 64
    assert model.tied_embeddings and model.kv_heads == 24 and model.vocab_size == 32000
    plain = parse("--num-layers 24 --hidden-size 2304 --num-attention-heads 24").model
    assert plain is not None and plain.ffn_hidden_size == 4 * 2304 and not plain.gated_mlp
    # add_bias_linear is on unless --disable-bias-linear (transformer_config.py)
    assert model.linear_bias and plain.linear_bias
    bare = parse("--num-layers 24 --hidden-size 2304 --num-attention-heads 24 "
                 "--disable-bias-linear").model
    assert bare is not None and not bare.linear_bias


def test_moe_flags_and_expert_tp_default() -> None:
    parsed = read_config(DATA / "megatron_moe_ep16.sh")
    assert parsed.model is not None and parsed.model.moe is not None
    assert (parsed.model.moe.num_experts, parsed.model.moe.top_k) == (128, 8)
    assert parsed.model.moe.expert_ffn_hidden_size == 768
    assert (parsed.settings.ep, parsed.settings.etp) == (16, 1)
    # --expert-tensor-parallel-size defaults to the TP size (docs/sources.md 6.2)
    default = parse("--tensor-model-parallel-size 2 --num-experts 8")
    assert default.settings.etp == 2


# ----- rules on realistic scripts ---------------------------------------------------------------


def test_tp8_on_8_gpu_nodes_passes() -> None:
    report = run_check("megatron_llama3_8b_tp8.sh")
    assert report.exit_code == 0 and report.findings == []
    summary = report.configs[0]
    assert summary.layout is not None and summary.layout.startswith("tp=8,pp=1,dp=2,cp=1")
    assert summary.num_gpus == 16 and summary.cluster == "dgx-h100 x 2 nodes"


def test_tp16_spans_nodes_and_fails() -> None:
    path = DATA / "megatron_llama3_8b_tp16.sh"
    report = run_check(path)
    assert report.exit_code == 1
    found = only(report, "tp-cross-node")
    assert found.severity == "error" and found.group == "tp"
    assert found.ranks == list(range(16)) and found.nodes == [0, 1]
    assert found.line == line_of(path, "--tensor-model-parallel-size")
    assert "ranks 0-15" in found.message and "nodes 0-1" in found.message


def test_use_tp_pp_dp_mapping_changes_which_ranks_pipeline_neighbours_are(tmp_path: Path) -> None:
    source = DATA / "megatron_llama3_70b_64nodes.sh"
    report = run_check(source)
    far = only(report, "pp-far-apart")
    assert far.severity == "info" and report.exit_code == 0
    # default order tp-cp-ep-dp-pp: a stage is 64 ranks = 8 nodes; stage 3 -> 4 leaves SU 0
    assert far.ranks == [192, 256] and far.nodes == [24, 32]
    remapped = tmp_path / "remapped.sh"
    remapped.write_text(source.read_text().replace("--sequence-parallel \\",
                                                   "--sequence-parallel --use-tp-pp-dp-mapping \\"))
    # tp-cp-ep-pp-dp: a pipeline spans 8 consecutive nodes, inside one 32-node leaf group
    assert rule_ids(run_check(remapped)) == []


def test_virtual_stages_from_layers_per_virtual_stage() -> None:
    report = run_check("megatron_llama3_70b_64nodes.sh")
    assert report.configs[0].layout is not None
    assert "pp=8" in report.configs[0].layout and "vpp=2" in report.configs[0].layout


def test_tp4_on_4_gpu_pcie_nodes_passes_with_a_note() -> None:
    report = run_check("megatron_gpt_tp4_pcie.sh", cluster="pcie-4x-l40s.yaml")
    assert report.exit_code == 0
    found = only(report, "tp-pcie-only")
    assert found.severity == "info" and found.ranks == [0, 1, 2, 3] and found.nodes == [0]


def test_tp8_on_4_gpu_pcie_nodes_fails() -> None:
    report = run_check("megatron_gpt_tp8_pcie.sh", cluster="pcie-4x-l40s.yaml")
    found = only(report, "tp-cross-node")
    assert found.nodes == [0, 1] and "keep tp <= 4" in found.message
    assert report.exit_code == 1


def test_tp4_across_nvlink_bridge_pairs(tmp_path: Path) -> None:
    path = DATA / "megatron_gpt_tp4_nvlink_pairs.sh"
    report = run_check(path, cluster="a100-pcie-nvlink-pairs.yaml")
    found = only(report, "tp-outside-nvlink")
    assert found.ranks == [0, 1, 2, 3] and found.nodes == [0] and report.exit_code == 1
    tp2 = tmp_path / "tp2.sh"
    tp2.write_text(path.read_text().replace("--tensor-model-parallel-size 4",
                                            "--tensor-model-parallel-size 2"))
    assert run_check(tp2, cluster="a100-pcie-nvlink-pairs.yaml").findings == []


def test_ep_group_leaving_the_node_is_a_warning() -> None:
    report = run_check("megatron_moe_ep16.sh")
    found = only(report, "ep-outside-nvlink")
    assert found.severity == "warning" and found.ranks == list(range(16))
    assert found.line == line_of(DATA / "megatron_moe_ep16.sh", "--expert-model-parallel-size")
    assert report.exit_code == 0
    assert run_check("megatron_moe_ep16.sh", fail_on="warning").exit_code == 1
    assert run_check("megatron_moe_ep8.sh").findings == []


def test_cp_group_across_nodes_is_a_warning() -> None:
    found = only(run_check("megatron_llama3_8b_cp2.sh"), "cp-cross-node")
    assert found.severity == "warning" and found.ranks == [0, 8] and found.nodes == [0, 1]


def test_degrees_that_do_not_divide_the_model() -> None:
    path = DATA / "megatron_gpt_bad_degrees.sh"
    found = only(run_check(path), "degrees-model")
    assert "num_layers=30" in found.message
    assert found.line == line_of(path, "--pipeline-model-parallel-size")


def test_degrees_that_do_not_divide_the_cluster() -> None:
    report = run_check("megatron_tp8_pp3.sh")
    found = only(report, "degrees-cluster")
    assert "24" in found.message and "16 GPUs" in found.message and report.exit_code == 1


def test_more_processes_per_node_than_gpus(tmp_path: Path) -> None:
    script = tmp_path / "big.sh"
    script.write_text("torchrun --nproc_per_node 16 --nnodes 1 x.py "
                      "--tensor-model-parallel-size 8\n")
    found = only(run_check(script), "degrees-cluster")
    assert "16 processes per node" in found.message


def test_fewer_processes_per_node_than_gpus_use_the_first_gpus(tmp_path: Path) -> None:
    script = tmp_path / "half.sh"
    script.write_text("torchrun --nproc_per_node 4 --nnodes 2 x.py "
                      "--tensor-model-parallel-size 4\n")
    report = run_check(script)
    assert rule_ids(report) == ["model-unknown"] and report.configs[0].num_gpus == 8
    script.write_text("torchrun --nproc_per_node 4 --nnodes 2 x.py "
                      "--tensor-model-parallel-size 8\n")
    assert only(run_check(script), "tp-cross-node").nodes == [0, 1]


def test_script_without_parallel_settings_is_an_info() -> None:
    report = run_check("prepare_data.sh")
    assert rule_ids(report) == ["no-parallel-settings"] and report.exit_code == 0


def test_world_size_from_nodes_option_when_the_script_has_none(tmp_path: Path) -> None:
    script = tmp_path / "args.txt"
    script.write_text("--tensor-model-parallel-size 8 --pipeline-model-parallel-size 2\n")
    report = run_check(script, nodes=4)
    assert report.configs[0].num_gpus == 32 and rule_ids(report) == ["model-unknown"]
    assert report.configs[0].layout is not None and "dp=2" in report.configs[0].layout


def test_deepspeed_launcher_flags_give_the_world_size() -> None:
    parsed = parse("deepspeed --num_gpus 8 --num_nodes 4 pretrain_gpt.py "
                   "--tensor-model-parallel-size 8 --deepspeed_config ds.json")
    assert (parsed.nproc_per_node, parsed.world_size) == (8, 32)


def test_gb200_nvl72_tp_across_trays_inside_the_nvlink_domain_passes(tmp_path: Path) -> None:
    # 18 trays of 4 GPUs share one 72-GPU NVLink domain: TP=8 spans two trays over NVLink.
    script = tmp_path / "nvl72.sh"
    script.write_text("torchrun --nproc_per_node 4 --nnodes 36 pretrain_gpt.py \\\n"
                      "  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1\n")
    report = run_check(script, cluster="gb200-nvl72")
    assert rule_ids(report) == ["model-unknown"] and report.configs[0].num_gpus == 144


def test_gb200_nvl72_tp_across_racks_fails(tmp_path: Path) -> None:
    layout = tmp_path / "layout.yaml"
    # dp innermost: a TP group takes every 18th rank, i.e. trays of both 72-GPU racks
    layout.write_text("layout: tp=8,dp=18\norder: dp-tp-cp-pp\ncluster: gb200-nvl72\n")
    found = only(run_check(layout, cluster=None), "tp-cross-node")
    assert found.ranks == list(range(0, 144, 18))
    assert found.nodes[0] < 18 <= found.nodes[-1]


def test_sequence_parallel_is_off_with_tp_1_as_in_megatron() -> None:
    for tp, expected in ((1, False), (2, True)):
        parsed = parse(f"--sequence-parallel --tensor-model-parallel-size {tp}")
        assert parsed.settings.sequence_parallel is expected


_UNEVEN = """#!/bin/bash
torchrun --nproc_per_node 8 --nnodes 16 pretrain_gpt.py \\
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 {split} \\
    --num-layers 126 --hidden-size 16384 --ffn-hidden-size 53248 --num-attention-heads 128 \\
    --group-query-attention --num-query-groups 8 --swiglu --vocab-size 128256 \\
    --seq-length 8192 --micro-batch-size 1 --global-batch-size 64 --sequence-parallel \\
    --use-distributed-optimizer --recompute-granularity full --bf16
"""


@pytest.mark.parametrize(("split", "problem"), [
    ("", "Megatron needs pp*vpp=16 to divide num_layers=126"),
    ("--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7", None),
    ("--pipeline-model-parallel-layout 'Et*7|(t*8|)*14t*7L'", None),
    ("--decoder-first-pipeline-num-layers 6", None),  # 15 stages of 8 after it
    ("--decoder-first-pipeline-num-layers 5", "the 121 middle layers must divide over the 15"),
])
def test_uneven_pipeline_splits_need_megatron_flags(tmp_path: Path, split: str,
                                                    problem: str | None) -> None:
    # Llama 3 405B: 126 layers on 16 stages, as Meta trained it (7, 14 x 8, 7).
    path = tmp_path / "megatron_405b.sh"
    path.write_text(_UNEVEN.format(split=split))
    findings = [f for f in run_check(path, cluster="dgx-h100").findings
                if f.rule_id == "degrees-model"]
    if problem is None:
        assert findings == []
    else:
        assert len(findings) == 1 and problem in findings[0].message


MXFP8_SCRIPT = (
    "torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 1 \\\n"
    "  --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 \\\n"
    "  --ffn-hidden-size 14336 --seq-length 8192 --max-position-embeddings 8192 \\\n"
    "  --micro-batch-size 1 --global-batch-size 128 --use-distributed-optimizer \\\n"
    "  --bf16 --fp8-format hybrid --fp8-recipe {recipe}\n")


def test_fp8_recipe_mxfp8_is_refused_on_hopper_and_read_on_blackwell(tmp_path: Path) -> None:
    """Transformer Engine runs MXFP8 on SM 10.0/10.3 only (mxfp8.rst, "Supported devices")."""
    script = tmp_path / "train.sh"
    script.write_text(MXFP8_SCRIPT.format(recipe="mxfp8"))
    assert parse_megatron(script, script.read_text()).settings.fp8_recipe == "mxfp8"
    refused = only(run_check(script, cluster="dgx-h100", nodes=1), "framework-refuses")
    assert refused.line == 5
    assert "H100-SXM-80GB has no MXFP8 tensor cores" in refused.message
    assert "framework-refuses" not in rule_ids(run_check(script, cluster="dgx-b200", nodes=1))


def test_fp8_recipe_tensorwise_passes_and_custom_is_a_note(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text(MXFP8_SCRIPT.format(recipe="tensorwise"))
    assert "framework-refuses" not in rule_ids(run_check(script, cluster="dgx-h100", nodes=1))
    parsed = parse(MXFP8_SCRIPT.format(recipe="custom"))
    assert parsed.settings.fp8_recipe is None
    assert any(note.startswith("--fp8-recipe custom: not a recipe placer models")
               for note in parsed.notes)
