"""runtime.torch_compile (--torch-compile): torchtitan's --compile.enable reaches the cost model,
``placer check`` and the launch files.

torchtitan compiles compile.components, ["model", "loss"] by default (pytorch/torchtitan@
b5bcd76 torchtitan/config/configs.py CompileConfig): each TransformerBlock and the loss. A
compiled block under op-level checkpointing does not keep w2's output (the policy saves it, the
backward never reads it: measured against AOTAutograd's min-cut partitioner in
tests/test_memory_pytorch.py), 2 h bytes per token and layer; a compiled loss peaks at 4 bytes
per logit entry instead of the eager fp32 cross-entropy's 12 (same file). The figures below are
hand calculations from Llama-3-8B's config (hidden 4096, 32 layers, vocabulary 128,256).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

from placer.check import CheckOptions, check_paths, read_config
from placer.check.parse_torchtitan_py import parse_torchtitan_py
from placer.cost.memory import FRAGMENTATION_FRACTION_RECOMPUTE
from placer.cost.stack_options import job_options
from placer.launch import launch_files
from placer.spec import Job, Layout
from placer.spec.presets import load_cluster, model_preset

tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11")

HIDDEN, LAYERS, VOCAB = 4096, 32, 128_256  # meta-llama/Llama-3.1-8B config.json
SEQ = 8192
ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--seq-len", str(SEQ), "--global-batch", "64", "--json"]
CORPUS = Path(__file__).resolve().parent / "data" / "check_corpus" / "torchtitan"
# pytorch/torchtitan@73a0e6979dd10b6b1904098eb3c8f62c18ab87ce (v0.2.2)
# torchtitan/models/llama3/train_configs/llama3_8b.toml: [compile] enable=false, 8192 tokens,
# local batch 1, FSDP, selective (op) checkpointing; ..._405b.toml: enable=true, TP8, full AC.
LLAMA3_8B = CORPUS / "v0.2.2_llama3_8b.toml"
LLAMA3_405B = CORPUS / "v0.2.2_llama3_405b.toml"
# pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a torchtitan/models/<m>/
# config_registry.py (torchtitan's Python configs)
LLAMA3_PY = CORPUS / "head_llama3_config_registry.py"
DEEPSEEK_PY = CORPUS / "head_deepseek_v3_config_registry.py"


def _estimate(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = cli([*ESTIMATE, *args], capsys)
    assert code == 0, err
    return json.loads(out)["memory"]


def test_the_knob_reaches_the_cost_options_as_the_stack_compiles() -> None:
    off = Job(seq_len=SEQ, global_batch_size=64, stack="torchtitan@0.2")
    assert not job_options(off).compiled_layers and not job_options(off).compiled_loss
    on = off.model_copy(update={"runtime": off.runtime.model_copy(
        update={"torch_compile": True})})
    assert job_options(on).compiled_layers and job_options(on).compiled_loss


def test_estimate_memory_drops_by_w2_outputs_and_the_eager_loss(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-8B, tp1, op-level recompute, one sequence of 8192 per micro-batch: compiled, the
    32 layers drop w2's bf16 output (2 x 4096 bytes per token) and the loss peaks at 4 bytes
    per entry instead of 12 (expandable segments: no fragmentation allowance)."""
    layout = ["--stack", "torchtitan@0.2", "--layout", "tp=1,dp=8,mbs=1,zero=3,recompute=op"]
    eager = _estimate(layout, capsys)
    compiled = _estimate([*layout, "--torch-compile"], capsys)
    tokens = SEQ
    assert eager["activations_bytes"] - compiled["activations_bytes"] == (
        2 * HIDDEN * tokens * LAYERS)  # 2.0 GiB
    assert eager["logits_bytes"] - compiled["logits_bytes"] == (12 - 4) * tokens * VOCAB
    assert eager["total_bytes"] - compiled["total_bytes"] == (
        2 * HIDDEN * tokens * LAYERS + 8 * tokens * VOCAB)  # 9.8 GiB of 46.8
    assert _estimate([*layout, "--no-torch-compile"], capsys) == eager


@pytest.mark.parametrize("stack", ["megatron-core@0.20", "deepspeed@0.19",
                                   "nemo-automodel@0.5", None])
def test_a_stack_that_compiles_nothing_refuses_it(
        stack: str | None, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Megatron-Core torch.compiles no layers (only small fused functions, megatron/core/jit.py);
    placer models no compile for DeepSpeed or NeMo AutoModel. Without --stack the job is planned
    on megatron-core (the default stack) and refused too, from the flag or the --job field."""
    stacks = ["--stack", stack] if stack else []
    code, _, err = cli([*ESTIMATE, *stacks, "--layout", "tp=1,dp=8,zero=1", "--torch-compile"],
                       capsys)
    assert_one_line_error(code, err)
    assert "runtime.torch_compile: True" in err and "--stack torchtitan@0.2" in err
    job = tmp_path / "job.yaml"
    job.write_text("seq_len: 8192\nglobal_batch_size: 64\nruntime:\n  torch_compile: true\n")
    code, _, err = cli([*ESTIMATE, *stacks, "--layout", "tp=1,dp=8,zero=1", "--job", str(job)],
                       capsys)
    assert_one_line_error(code, err)
    assert "runtime.torch_compile" in err


def test_torchtitan_toml_compile_settings_are_read() -> None:
    """[compile] enable with its components (torchtitan from Aug 2025, 08b8b244f); the older
    [training] compile compiled the loss as well in a file with [parallelism] (v0.1.0 at
    f7084fc: components/loss.py build_cross_entropy_loss) and only the blocks in 2024."""
    assert read_config(LLAMA3_405B).settings.compile_components == ("model", "loss")
    assert read_config(LLAMA3_405B).lines["torch_compile"] == 58  # enable=true
    assert read_config(LLAMA3_8B).settings.compile_components == ()
    # pytorch/torchtitan@f7084fc torchtitan/models/llama3/train_configs/llama3_405b.toml
    assert read_config(CORPUS / "v0.1.0_llama3_405b.toml").settings.compile_components == (
        "model", "loss")


def test_torchtitan_2024_training_compile_is_the_blocks_only(tmp_path: Path) -> None:
    """pytorch/torchtitan@3227d50 train_configs/llama3_8b.toml (2024 keys) with its
    ``compile = false`` turned on: the loss compile was still commented out then."""
    text = (CORPUS / "2024-06_llama3_8b.toml").read_text().replace("compile = false",
                                                                   "compile = true")
    path = tmp_path / "llama3_8b.toml"
    path.write_text(text)
    assert read_config(path).settings.compile_components == ("model",)


def test_torchtitan_python_compile_configs_are_read() -> None:
    """CompileConfig as a keyword of Trainer.Config, through a local variable (llama3_405b),
    assigned to config.compile (llama3_8b_mxfp8: the model only) or inherited from the config
    function called (deepseek_v3_16b_hybridep: deepseek_v3_16b's loss only)."""
    got = {p.label: p.settings.compile_components
           for path in (LLAMA3_PY, DEEPSEEK_PY) for p in parse_torchtitan_py(path,
                                                                              path.read_text())}
    assert got["llama3_405b"] == ("model", "loss")  # CompileConfig(enable=True, async TP)
    assert got["llama3_8b_mxfp8"] == ("model",)
    assert got["llama3_8b"] == ()
    assert got["deepseek_v3_16b"] == ("loss",)
    assert got["deepseek_v3_16b_hybridep"] == ("loss",)


def _check_peak_gib(path: Path) -> tuple[float, list[str]]:
    # judged on 40 GB GPUs, where the peak exceeds the capacity and so is reported
    report = check_paths([path], CheckOptions(cluster=load_cluster("dgx-a100-40gb"), nodes=1))
    found = [f for f in report.findings if f.rule_id == "memory-over-capacity"]
    assert found, report.findings
    return (float(found[0].message.split("predicted peak ")[1].split(" GiB")[0]),
            report.configs[0].notes)


def test_check_prices_the_compiled_loss_of_a_torchtitan_config(tmp_path: Path) -> None:
    """torchtitan's v0.2.2 Llama-3-8B config with [compile] enable turned on: check prices it
    on the torchtitan stack (eager blocks and loss) with op-level checkpointing, so its peak
    drops by the loss's 8192 x 128,256 local logits at the 8 bytes per entry a compiled loss
    saves over the eager fp32 cross-entropy (12 -> 4) and by w2's outputs, 2 h bytes per token
    and layer, that a compiled block under op-level SAC does not keep, each with the
    fragmentation allowance's f / (1 - f) (the config recomputes); the model alone saves w2's
    outputs only."""
    text = LLAMA3_8B.read_text()
    assert "enable=false\ncomponents = [\"model\", \"loss\"]" in text
    on, model_only = tmp_path / "on" / LLAMA3_8B.name, tmp_path / "model" / LLAMA3_8B.name
    for path, components in ((on, '["model", "loss"]'), (model_only, '["model"]')):
        path.parent.mkdir()
        path.write_text(text.replace("enable=false\ncomponents = [\"model\", \"loss\"]",
                                     f"enable=true\ncomponents = {components}"))
    eager, _ = _check_peak_gib(LLAMA3_8B)
    compiled, notes = _check_peak_gib(on)
    f = FRAGMENTATION_FRACTION_RECOMPUTE
    w2_outputs = 2 * HIDDEN * SEQ * LAYERS / 2**30 / (1 - f)
    assert eager - compiled == pytest.approx(8 * SEQ * VOCAB / 2**30 / (1 - f) + w2_outputs,
                                             abs=0.1)
    assert any(n.startswith("torch.compile: model, loss") for n in notes)
    assert eager - _check_peak_gib(model_only)[0] == pytest.approx(w2_outputs, abs=0.1)


def _plan(torch_compile: bool, stack: str | None = "torchtitan@0.2"):  # noqa: ANN202
    from helpers_launch import candidate, plan, small_cluster

    model, cluster = model_preset("llama3-8b"), small_cluster(2, 8)
    job = Job(name="compile-test", seq_len=4096, global_batch_size=64, stack=stack,
              runtime={"torch_compile": torch_compile})
    layout = Layout(tp=2, dp=8, zero_stage=3, recompute="full")
    return plan(model, cluster, [candidate(model, cluster, job, layout)], job=job)


def test_torchtitan_launch_files_carry_the_compile_setting() -> None:
    files = {f.name: f.text for f in launch_files(_plan(True))}
    doc = tomllib.loads(files["torchtitan.toml"])
    assert doc["compile"] == {"enable": True, "components": ["model", "loss"]}
    assert "config.compile.enable = True" in files["torchtitan_config.py"]
    assert "config.compile.components = ['model', 'loss']" in files["torchtitan_config.py"]
    # Megatron-LM does not compile: its files say the estimate assumed what it will not do
    assert "torch.compiles the model" in files["megatron_args.sh"]
    off = {f.name: f.text for f in launch_files(_plan(False))}
    assert "compile" not in tomllib.loads(off["torchtitan.toml"])
    assert "config.compile" not in off["torchtitan_config.py"]
    assert "torch.compiles" not in off["megatron_args.sh"]


def test_torchtitan_01_toml_compiles_under_training() -> None:
    from placer.launch import launch_bundle

    files, _ = launch_bundle(_plan(True), 0, framework_versions=("torchtitan=0.1",))
    doc = tomllib.loads({f.name: f.text for f in files}["torchtitan.toml"])
    assert doc["training"]["compile"] is True and "compile" not in doc


def test_the_schemas_carry_the_knob(capsys: pytest.CaptureFixture[str]) -> None:
    """``placer schema job`` takes runtime.torch_compile (and refuses a misspelling);
    ``placer schema stack`` takes compile_components, and every preset stack validates."""
    import jsonschema

    from placer.spec.presets import load_preset_yaml
    from placer.spec.stack import _stack_files

    def schema(name: str) -> dict:
        code, out, err = cli(["schema", name], capsys)
        assert code == 0, err
        return json.loads(out)

    job = {"seq_len": 8192, "global_batch_size": 64, "stack": "torchtitan@0.2",
           "runtime": {"torch_compile": True}}
    jsonschema.validate(job, schema("job"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**job, "runtime": {"torch_compiled": True}}, schema("job"))
    stack = schema("stack")
    for text in _stack_files().values():
        jsonschema.validate(load_preset_yaml(text), stack)
    assert load_preset_yaml(_stack_files()["torchtitan@0.2"])["compile_components"] == [
        "layers", "loss"]
