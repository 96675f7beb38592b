"""The framework dialects ``placer check`` reads, each against the framework's own rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_check import run_check

from placer.check.parse import read_configs
from placer.check.parse_megatron import parse_megatron
from placer.check.resolve import deepspeed_partition

CORPUS = Path(__file__).resolve().parent / "data" / "check_corpus"


@pytest.mark.parametrize(("layers", "pp", "method", "expected"), [
    # BLOOM-176B: 70 layers + 2 tied embeddings, 6 units per stage
    (70, 12, "type:transformer|embedding", {"embedding_in_split": True, "loss_in_split": True}),
    # BLOOMZ: one unit per stage, the first and last hold only the embedding
    (70, 72, "type:transformer|embedding", {"embedding_in_split": True, "loss_in_split": True}),
    (64, 32, "type:transformer", {"stage_layers": (2,) * 32}),
    (10, 4, "type:transformer", {"stage_layers": (2, 2, 3, 3)}),  # balanced, no divisibility
])
def test_deepspeed_partition_balances_the_matching_layers(layers: int, pp: int, method: str,
                                                          expected: dict[str, object]) -> None:
    assert deepspeed_partition(layers, pp, method) == (expected, None)


def test_deepspeed_partition_refuses_empty_stages() -> None:
    assert "hold nothing" in (deepspeed_partition(70, 73, "type:transformer|embedding")[1] or "")
    assert "no transformer layer" in (deepspeed_partition(70, 4, "type:embedding")[1] or "")


def test_megatron_deepspeed_names() -> None:
    parsed = parse_megatron(Path("ds.sh"), (
        "deepspeed --num_gpus 8 --num_nodes 2 pretrain_gpt.py --deepspeed --bf16 "
        "--deepspeed_config ds.json --zero-stage 0 --checkpoint-activations "
        "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 "
        "--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --pad-vocab-size-to 250880 "
        "--num-experts 16 --moe-expert-parallel-size 4\n"))
    s = parsed.settings
    assert parsed.kind == "megatron-deepspeed" and parsed.world_size == 16
    assert (s.tp, s.pp, s.ep, s.recompute) == (4, 4, 4, "full")
    assert s.partition_method == "type:transformer" and s.zero_stage == 1  # bf16 optimizer
    assert parsed.model is not None and parsed.model.vocab_size == 250880


def test_megatron_pipeline_without_deepspeed_needs_even_layers(tmp_path: Path) -> None:
    script = tmp_path / "mds.sh"
    body = ("torchrun --nproc_per_node 8 pretrain_gpt.py {ds} --tensor-model-parallel-size 1 "
            "--pipeline-model-parallel-size 8 --num-layers 30 --hidden-size 1024 "
            "--num-attention-heads 16 --seq-length 2048 --micro-batch-size 1 "
            "--global-batch-size 64 --vocab-size 50304\n")
    script.write_text(body.format(ds="--deepspeed"))  # DeepSpeed balances 30 over 8: fine
    assert "degrees-model" not in {f.rule_id for f in run_check(script).findings}
    script.write_text(body.format(ds="--deepspeed --no-pipeline-parallel"))
    assert "degrees-model" in {f.rule_id for f in run_check(script).findings}


def test_fp8_and_bf16_gradient_flags_reach_the_memory_model(tmp_path: Path) -> None:
    recipe = CORPUS / "megatron" / "llama3_8b_h100_fp8.sh"
    with_flags = run_check(recipe)
    plain = tmp_path / "plain.sh"
    plain.write_text(recipe.read_text().replace('DTYPE="fp8"', 'DTYPE="bf16"')
                     .replace("--grad-reduce-in-bf16", ""))
    without = run_check(plain)
    assert not [f for f in with_flags.findings if f.severity == "error"]
    errors = [f for f in without.findings if f.rule_id == "memory-over-capacity"]
    assert errors and errors[0].severity == "error"  # fp32 grads and bf16 weights do not fit


def test_torchtitan_2024_training_keys(tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text("[model]\nname = 'llama3'\nflavor = '8B'\n[training]\nbatch_size = 2\n"
                    "seq_len = 8192\ndata_parallel_degree = -1\ntensor_parallel_degree = 16\n"
                    "[experimental]\npipeline_parallel_degree = 2\n")
    parsed = read_configs(path)[0]
    assert (parsed.settings.tp, parsed.settings.pp, parsed.settings.dp) == (16, 2, None)
    assert parsed.lines["tp"] == 8 and parsed.model_ref == "llama3-8b"
    assert "tp-cross-node" in {f.rule_id for f in run_check(path, nodes=4).findings}


def test_torchtitan_python_configs(tmp_path: Path) -> None:
    path = tmp_path / "config_registry.py"
    path.write_text(
        "def llama3_70b() -> Trainer.Config:\n"
        "    return Trainer.Config(model_spec=model_registry('70B'),\n"
        "        parallelism=ParallelismConfig(tensor_parallel_degree=16),\n"
        "        activation_checkpoint=FullAC.Config())\n"
        "def llama3_70b_pp() -> Trainer.Config:\n"
        "    config = llama3_70b()\n"
        "    config.parallelism.tensor_parallel_degree = 8\n"
        "    config.parallelism.pipeline_parallel_degree = 2\n"
        "    return config\n")
    configs = read_configs(path)
    assert [c.label for c in configs] == ["llama3_70b", "llama3_70b_pp"]
    assert [(c.settings.tp, c.settings.pp) for c in configs] == [(16, 1), (8, 2)]
    assert configs[0].settings.recompute == "full" and configs[1].model_ref == "llama3-70b"
    report = run_check(path, nodes=2)
    assert [(f.rule_id, f.config) for f in report.findings if f.severity == "error"] == [
        ("tp-cross-node", "llama3_70b")]


def test_neox_and_nemo_yaml(tmp_path: Path) -> None:
    neox = tmp_path / "neox.yml"
    neox.write_text('{"pipe-parallel-size": 2, "model-parallel-size": 16, "num-layers": 44,\n'
                    ' "hidden-size": 6144, "num-attention-heads": 64, "seq-length": 2048}\n')
    parsed = read_configs(neox)[0]
    assert parsed.kind == "gpt-neox" and (parsed.settings.tp, parsed.settings.pp) == (16, 2)
    assert parsed.settings.partition_method == "type:transformer|mlp"
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text("trainer:\n  num_nodes: 4\n  devices: 8\nmodel:\n"
                    "  tensor_model_parallel_size: 2\n"
                    "  pipeline_model_parallel_size: 2\n  num_layers: 32\n  hidden_size: 4096\n"
                    "  ffn_hidden_size: ${multiply:4, ${.hidden_size}}\n"
                    "  num_attention_heads: 32\n  encoder_seq_length: 4096\n"
                    "  micro_batch_size: 1\n  global_batch_size: 128\n")
    parsed = read_configs(nemo)[0]
    assert parsed.world_size == 32 and parsed.model is not None
    assert parsed.model.ffn_hidden_size == 16384
    assert parsed.model.linear_bias  # NeMo's model.bias defaults on, as add_bias_linear
    nemo.write_text(nemo.read_text() + "  bias: false\n")
    model = read_configs(nemo)[0].model
    assert model is not None and not model.linear_bias


def test_recompute_modules_and_block_layers_reach_the_layout() -> None:
    parsed = parse_megatron(Path("r.sh"), (
        "torchrun --nproc_per_node 8 x.py --recompute-granularity selective "
        "--recompute-modules core_attn mlp --tensor-model-parallel-size 2\n"))
    assert parsed.settings.layout_values()["recompute_modules"] == ("core_attn", "mlp")
    parsed = parse_megatron(Path("r.sh"), (
        "torchrun --nproc_per_node 8 x.py --recompute-granularity full --recompute-method block "
        "--recompute-num-layers 4 --cpu-offloading-num-layers 2\n"))
    values = parsed.settings.layout_values()
    assert (values["recompute"], values["recompute_layers"], values["offload_layers"]) == (
        "full", 4, 2)
