"""Multi-head latent attention reaches the Megatron files, and ``placer check`` reads it back.

Hand figures: DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3) has q_lora_rank 1536,
kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128; Megatron-LM's own
DeepSeek-V3 script (NVIDIA/Megatron-LM@55ac708 = core_v0.16.1,
docs/discussions/megatron-fsdp-user-guide/example-scripts/sbatch_mfsdp_deepseek_v3.sh, copied
verbatim to tests/data/check/nvidia_mfsdp_deepseek_v3.sh) passes them as
--multi-latent-attention --qk-layernorm --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
--qk-pos-emb-head-dim 64 --v-head-dim 128.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from helpers_mla import ROOT, mla_plan

from placer.check.parse import read_configs
from placer.check.parse_megatron import parse_megatron
from placer.cli.launch_command import load_plan
from placer.launch import launch_files
from placer.spec import Plan
from placer.spec.presets import model_preset

NVIDIA_SCRIPT = ROOT / "tests" / "data" / "check" / "nvidia_mfsdp_deepseek_v3.sh"
MLA_FLAGS = ("--multi-latent-attention", "--qk-layernorm", "--q-lora-rank", "--kv-lora-rank",
             "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim")


def _argv(plan: Plan, tmp_path: Path) -> list[str]:
    path = tmp_path / "megatron_args.sh"
    path.write_text({f.name: f.text for f in launch_files(plan)}["megatron_args.sh"])
    done = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\0" "${MEGATRON_ARGS[@]}"',
                           "bash", str(path)], capture_output=True, text=True, check=True,
                          timeout=30)
    return done.stdout.split("\0")[:-1]


def _values(argv: list[str]) -> dict[str, str | None]:
    """Each MLA flag -> its value (None for a switch)."""
    out: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if word in MLA_FLAGS:
            value = argv[i + 1] if i + 1 < len(argv) else None
            out[word] = None if value is None or value.startswith("--") else value
    return out


def _bridge_model(plan: Plan) -> dict[str, object]:
    text = {f.name: f.text for f in launch_files(plan)}["megatron_bridge_overrides.yaml"]
    return yaml.safe_load(text)["model"]


def test_deepseek_v3_megatron_flags_are_its_latent_attention(tmp_path: Path) -> None:
    values = _values(_argv(mla_plan(), tmp_path))
    assert values == {"--multi-latent-attention": None, "--qk-layernorm": None,
                      "--q-lora-rank": "1536", "--kv-lora-rank": "512", "--qk-head-dim": "128",
                      "--qk-pos-emb-head-dim": "64", "--v-head-dim": "128"}
    nvidia = _values(NVIDIA_SCRIPT.read_text().split())
    assert values == nvidia


def test_deepseek_v3_bridge_model_fields() -> None:
    model = _bridge_model(mla_plan())
    assert {k: model[k] for k in ("multi_latent_attention", "qk_layernorm", "q_lora_rank",
                                  "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                                  "v_head_dim")} == {
        "multi_latent_attention": True, "qk_layernorm": True, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}


def test_no_query_compression_writes_no_rank_flag_and_bridge_null(tmp_path: Path) -> None:
    # DeepSeek-V2-Lite's shape: queries straight from the hidden state (q_lora_rank null).
    v3 = model_preset("deepseek-v3")
    assert v3.mla is not None
    lite = v3.model_copy(update={"mla": v3.mla.model_copy(update={"q_lora_rank": None})})
    values = _values(_argv(mla_plan(lite), tmp_path))
    assert "--q-lora-rank" not in values  # Megatron's default is None (no compression)
    assert values["--kv-lora-rank"] == "512"
    model = _bridge_model(mla_plan(lite))
    # MLATransformerConfig's own default is 512, so null must be written.
    assert "q_lora_rank" in model and model["q_lora_rank"] is None


def test_dense_attention_writes_no_mla_flag(tmp_path: Path) -> None:
    plan = load_plan(ROOT / "examples" / "llama3-70b-8x-dgx-h100" / "plan.json")
    assert _values(_argv(plan, tmp_path)) == {}
    assert not {"multi_latent_attention", "q_lora_rank"} & set(_bridge_model(plan))


def test_check_reads_nvidias_deepseek_v3_script_as_latent_attention() -> None:
    parsed = parse_megatron(NVIDIA_SCRIPT, NVIDIA_SCRIPT.read_text())
    preset = model_preset("deepseek-v3")
    assert parsed.model is not None
    # --kv-channels 128 is in the script too; the query/key head is 128 + 64 wide.
    assert parsed.model.head_dim == preset.head_dim == 192
    assert parsed.model.mla == preset.mla


def test_check_reads_placers_own_flags_back(tmp_path: Path) -> None:
    argv = _argv(mla_plan(), tmp_path)
    model = ("--num-layers 61 --hidden-size 7168 --num-attention-heads 128 "
             "--ffn-hidden-size 18432 --swiglu")
    script = f"torchrun pretrain_gpt.py {model} {' '.join(argv)}\n"
    parsed = parse_megatron(tmp_path / "train.sh", script)
    assert parsed.model is not None
    assert parsed.model.mla == model_preset("deepseek-v3").mla
    assert parsed.model.head_dim == 192


def test_check_reads_a_model_section_with_latent_attention(tmp_path: Path) -> None:
    # DeepSeek-V3's attention as a NeMo/Bridge model section; kv_lora_rank and v_head_dim left
    # to MLATransformerConfig's dataclass defaults (512, 128), q_lora_rank written.
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text("trainer:\n  num_nodes: 4\n  devices: 8\nmodel:\n"
                    "  tensor_model_parallel_size: 2\n  num_layers: 61\n  hidden_size: 7168\n"
                    "  ffn_hidden_size: 18432\n  num_attention_heads: 128\n"
                    "  multi_latent_attention: true\n  q_lora_rank: 1536\n"
                    "  qk_head_dim: 128\n  qk_pos_emb_head_dim: 64\n")
    parsed = read_configs(nemo)[0]
    assert parsed.model is not None
    assert parsed.model.mla == model_preset("deepseek-v3").mla
    assert parsed.model.head_dim == 192
