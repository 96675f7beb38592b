"""``placer check`` reads the FP8 recipe each framework names, the way the framework reads it.

- torchtitan: the model converters (0.1 ``float8`` / ``mx``; 0.2 ``quantize.linear.float8`` ...,
  options under ``[quantize.linear.float8]``; 0.3 converter classes in a Python config) and the
  float8 recipe (0.2: unset is tensorwise, the one with FSDP float8 all-gather; 0.3: rowwise by
  default, torchtitan 0.3.0 components/quantization/float8.py L58).
- Megatron-Bridge: ``mixed_precision`` as a recipe name (the table tests/test_launch_accept_
  megatron.py checks against Bridge's own source) or as a MixedPrecisionConfig mapping, and
  megatron-core's ``model.fp8`` format string with ``model.fp8_recipe``.
- Megatron-LM: ``--fp4-format`` (NVFP4), priced as FP8 with a note.

A config that used to be read as BF16 (torchtitan 0.2's converter names, any 0.3 converter,
Bridge's recipes) was priced with 2-byte GEMM inputs and never refused on Hopper under MXFP8.
"""

from __future__ import annotations

from pathlib import Path

from helpers_check import only, rule_ids, run_check

from placer.check.parse import read_config, read_configs
from placer.check.parse_megatron import parse_megatron
from placer.check.parsed import ParsedConfig

DATA = Path(__file__).resolve().parent / "data" / "check_corpus" / "torchtitan"
# pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (corpus.json)
# torchtitan/models/llama3/config_registry.py
LLAMA3_REGISTRY = DATA / "head_llama3_config_registry.py"
# pytorch/torchtitan@73a0e6979dd10b6b1904098eb3c8f62c18ab87ce (v0.2.2)
# torchtitan/models/llama3/train_configs/llama3_405b.toml: converters = ["float8"],
# [quantize.linear.float8] enable_fsdp_float8_all_gather = true
LLAMA3_405B_TOML = DATA / "v0.2.2_llama3_405b.toml"


def test_torchtitan_03_registry_converters() -> None:
    configs = {c.label: c for c in read_configs(LLAMA3_REGISTRY)}
    assert configs["llama3_8b"].settings.precision == "bf16"
    mx = configs["llama3_8b_mxfp8"]
    assert (mx.settings.precision, mx.settings.fp8_recipe) == ("fp8", "mxfp8")
    assert mx.lines["fp8_recipe"] == 261  # MXFP8LinearConverter.Config(
    for name in ("llama3_debugmodel_float8", "llama3_405b"):  # no recipe_name: 0.3's rowwise
        assert (configs[name].settings.precision, configs[name].settings.fp8_recipe) == (
            "fp8", "rowwise"), name
    nvfp4 = configs["llama3_debugmodel_nvfp4"]
    assert nvfp4.settings.precision == "fp8" and nvfp4.settings.fp8_recipe is None
    assert any(n.startswith("NVFP4 converter: priced as FP8") for n in nvfp4.notes)


def test_mxfp8_registry_config_is_refused_on_hopper_only() -> None:
    h100 = run_check(LLAMA3_REGISTRY, cluster="dgx-h100", nodes=1)
    refused = [f for f in h100.findings if f.rule_id == "framework-refuses"]
    assert [f.config for f in refused] == ["llama3_8b_mxfp8"]
    assert "H100-SXM-80GB has no MXFP8 tensor cores" in refused[0].message
    assert "framework-refuses" not in rule_ids(run_check(LLAMA3_REGISTRY, cluster="dgx-b200",
                                                         nodes=1))


def test_torchtitan_02_toml_names_and_options(tmp_path: Path) -> None:
    shipped = read_config(LLAMA3_405B_TOML).settings
    assert (shipped.precision, shipped.fp8_recipe, shipped.fp8_param_gather) == (
        "fp8", "tensorwise", True)
    text = LLAMA3_405B_TOML.read_text()
    for converters, extra, expect in (
            ('["quantize.linear.float8"]', 'recipe_name = "rowwise"\n', ("fp8", "rowwise")),
            ('["quantize.linear.mx", "quantize.grouped_mm.mx"]', "", ("fp8", "mxfp8")),
            ("[]", "", ("bf16", None))):
        variant = text.replace('converters = ["float8"]', f"converters = {converters}").replace(
            "[quantize.linear.float8]\n", f"[quantize.linear.float8]\n{extra}")
        path = tmp_path / f"{len(extra)}-{len(converters)}.toml"
        path.write_text(variant)
        got = read_config(path).settings
        assert (got.precision, got.fp8_recipe) == expect, converters
        # FSDP float8 all-gather is tensorwise-only (0.2.2 float8.py asserts it away otherwise)
        assert got.fp8_param_gather is False


BRIDGE = """\
model:
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
{model}train:
  micro_batch_size: 1
  global_batch_size: 64
dataset:
  sequence_length: 4096
{mixed}"""


def _bridge(tmp_path: Path, mixed: str = "", model: str = "") -> tuple[ParsedConfig, Path]:
    path = tmp_path / f"bridge{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(BRIDGE.format(mixed=mixed, model=model))
    return read_config(path), path


def test_bridge_mixed_precision_recipes(tmp_path: Path) -> None:
    parsed, path = _bridge(tmp_path, "mixed_precision: bf16_with_mxfp8_mixed\n")
    s = parsed.settings
    assert (s.precision, s.fp8_recipe, s.fp8_param_gather) == ("fp8", "mxfp8", True)
    assert parsed.lines["fp8_recipe"] == 9  # mixed_precision:
    s = _bridge(tmp_path, "mixed_precision: bf16-with-fp8-current-scaling-mixed\n")[0].settings
    assert (s.precision, s.fp8_recipe) == ("fp8", "tensorwise")
    s = _bridge(tmp_path, "mixed_precision: bf16_mixed\n")[0].settings
    assert s.precision == "bf16"
    nvfp4 = _bridge(tmp_path, "mixed_precision: bf16_with_nvfp4_mixed\n")[0]
    assert nvfp4.settings.precision == "fp8" and nvfp4.settings.fp8_recipe is None
    assert any("priced as FP8" in n for n in nvfp4.notes)


def test_bridge_mapping_and_model_fields(tmp_path: Path) -> None:
    mapping = "mixed_precision:\n  fp8: e4m3\n  fp8_recipe: blockwise\n"
    s = _bridge(tmp_path, mapping)[0].settings
    assert (s.precision, s.fp8_recipe, s.fp8_param_gather) == ("fp8", "blockwise", False)
    model = "  fp8: hybrid\n  fp8_recipe: tensorwise\n"
    s = _bridge(tmp_path, model=model)[0].settings
    assert (s.precision, s.fp8_recipe) == ("fp8", "tensorwise")
    # Bridge applies mixed_precision to the model last (MixedPrecisionConfig.setup)
    s = _bridge(tmp_path, "mixed_precision: bf16_mixed\n", model)[0].settings
    assert s.precision == "bf16"


def test_bridge_mxfp8_recipe_is_refused_on_hopper(tmp_path: Path) -> None:
    _, path = _bridge(tmp_path, "mixed_precision: bf16_with_mxfp8_mixed\n")
    findings = run_check(path, cluster="dgx-h100", nodes=1, model="llama3-8b")
    assert only(findings, "framework-refuses").line == 9


def test_megatron_fp4_format_is_priced_as_fp8(tmp_path: Path) -> None:
    script = tmp_path / "train.sh"
    script.write_text("torchrun pretrain_gpt.py --tensor-model-parallel-size 2 --bf16 "
                      "--fp4-format e2m1 --fp4-recipe nvfp4\n")
    parsed = parse_megatron(script, script.read_text())
    assert parsed.settings.precision == "fp8" and parsed.settings.fp8_recipe is None
    assert any(n.startswith("--fp4-format e2m1: priced as FP8") for n in parsed.notes)
