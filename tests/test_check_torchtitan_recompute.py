"""``placer check`` prices a torchtitan config on the torchtitan stack with its recomputation as
torchtitan runs it.

torchtitan's ``[activation_checkpoint] mode = "selective"`` with ``selective_ac_option = "op"``
is op-level selective checkpointing (placer's ``recompute=op``), not Megatron's selective
recompute of core attention; a number N there checkpoints every Nth block whole
(pytorch/torchtitan@73a0e69 torchtitan/distributed/activation_checkpoint.py
_apply_ac_to_transformer_block, _apply_layer_sac); 0.3's Python configs name the policy by
class (torchtitan 0.3.0 distributed/activation_checkpoint.py: SelectiveAC is per-op SAC, FullAC
whole blocks, the Trainer.Config default SelectiveAC). torchtitan's modules are eager PyTorch
(the torchtitan@0.2 stack preset), not Megatron's fused kernels.

The independent path for the memory figures is ``placer estimate`` given the same layout, stack
and recompute explicitly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import cli

from placer.check import read_config
from placer.check.parse_torchtitan_py import parse_torchtitan_py

CORPUS = Path(__file__).resolve().parent / "data" / "check_corpus" / "torchtitan"
# pytorch/torchtitan@73a0e6979dd10b6b1904098eb3c8f62c18ab87ce (v0.2.2)
# torchtitan/models/llama3/train_configs/llama3_8b.toml: Llama 3 8B, seq_len 8192, local batch
# 1, FSDP over every GPU, mode = "selective", selective_ac_option = "op"
LLAMA3_8B = CORPUS / "v0.2.2_llama3_8b.toml"
# pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a
# torchtitan/models/llama3/config_registry.py (Python configs, one per function)
LLAMA3_PY = CORPUS / "head_llama3_config_registry.py"
CHECK = ["--cluster", "dgx-a100-40gb", "--nodes", "1"]
LAYOUT = "tp=1,pp=1,dp=8,mbs=1,zero=3"  # the config's layout on one 8-GPU node
OPTION = 'selective_ac_option = "op"'


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    code, out, err = cli(["check", str(path), *CHECK, "--format", "json"], capsys)
    assert code in (0, 1), err
    return json.loads(out)


def _peak_gib(report: dict) -> float:
    found = [f for f in report["findings"] if f["rule_id"] == "memory-over-capacity"]
    assert len(found) == 1, report["findings"]
    return float(found[0]["message"].split("predicted peak ")[1].split(" GiB")[0])


def _estimate_gib(layout: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                  stack: str | None = "torchtitan@0.2") -> float:
    """``placer estimate`` of the config's job: 8 sequences of 8192 tokens, and the caching
    allocator without expandable segments, as check reads the config's (empty) environment."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"seq_len": 8192, "global_batch_size": 8,
                               "runtime": {"expandable_segments": False},
                               **({"stack": stack} if stack else {})}))
    code, out, err = cli(["estimate", "--model", "llama3-8b", *CHECK, "--job", str(job),
                          "--layout", layout, "--json"], capsys)
    assert code == 0, err
    return json.loads(out)["memory"]["total_bytes"] / 2**30


def test_llama3_8b_op_sac_is_priced_on_the_torchtitan_stack(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    report = _check(LLAMA3_8B, capsys)
    config = report["configs"][0]
    assert config["layout"] == "tp=1,pp=1,dp=8,cp=1,vpp=1,mbs=1,zero=3,recompute=op,sp=off"
    assert any(n.startswith("stack torchtitan@0.2 (the torchtitan preset for TOML configs")
               for n in config["notes"])
    peak = _peak_gib(report)  # 53.5 GiB on 40 GB A100s: the finding states it
    assert peak == round(_estimate_gib(f"{LAYOUT},recompute=op", capsys, tmp_path), 1)
    # what check priced before: Megatron's selective recompute on fused kernels (no stack)
    before = _estimate_gib(f"{LAYOUT},recompute=selective", capsys, tmp_path, stack=None)
    assert before - peak > 15  # 70.7 GiB


def test_every_nth_block_is_full_recompute_of_that_share(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """selective_ac_option = "2": torchtitan checkpoints blocks 2, 4, ..., 32 of Llama 3 8B's
    32 (hand count: 16 recomputed whole, 16 kept); "1" every block."""
    text = LLAMA3_8B.read_text()
    assert OPTION in text
    every_2nd = tmp_path / "2" / LLAMA3_8B.name
    every_1 = tmp_path / "1" / LLAMA3_8B.name
    for path, option in ((every_2nd, "2"), (every_1, "1")):
        path.parent.mkdir()
        path.write_text(text.replace(OPTION, f'selective_ac_option = "{option}"'))
    report = _check(every_2nd, capsys)
    assert report["configs"][0]["layout"].endswith(",recompute=full,sp=off,rlayers=16")
    peak = _peak_gib(report)
    # ``placer estimate --stack torchtitan@0.2`` refuses rlayers (the stack lists whole-block
    # recompute only, what placer searches and launches): the cost model's own entry point,
    # given the hand-counted layout, the stack and the job
    from placer.cost import memory_estimate
    from placer.spec import Job, Layout
    from placer.spec.presets import load_cluster, model_preset

    job = Job(seq_len=8192, global_batch_size=8, stack="torchtitan@0.2",
              runtime={"expandable_segments": False})
    layout = Layout.parse(f"{LAYOUT},recompute=full,rlayers=16")
    memory = memory_estimate(model_preset("llama3-8b"), load_cluster("dgx-a100-40gb"), job,
                             layout)
    assert peak == round(memory.total_bytes / 2**30, 1)
    whole = _check(every_1, capsys)
    assert whole["configs"][0]["layout"].endswith(",recompute=full,sp=off")
    assert _peak_gib(whole) == round(_estimate_gib(f"{LAYOUT},recompute=full", capsys,
                                                   tmp_path), 1)


def test_torchtitan_refusals_are_findings(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """What torchtitan 0.2.2 stops on at start: an unknown mode ('Invalid AC mode'), an option
    neither "op" nor digits ('Invalid selective AC option'), a TOML integer (it calls
    ``.isdigit()`` on it), memory_budget without a compiled model."""
    text = LLAMA3_8B.read_text()
    cases = {"mode": (text.replace('mode = "selective"', 'mode = "sometimes"'), "mode"),
             "letters": (text.replace(OPTION, 'selective_ac_option = "x"'),
                         "selective_ac_option"),
             "integer": (text.replace(OPTION, "selective_ac_option = 2"),
                         "selective_ac_option"),
             "budget": (text.replace('mode = "selective"', 'mode = "memory_budget"'), "mode")}
    for name, (body, key) in cases.items():
        path = tmp_path / name / LLAMA3_8B.name
        path.parent.mkdir()
        path.write_text(body)
        found = [f for f in _check(path, capsys)["findings"]
                 if f["rule_id"] == "framework-refuses"]
        assert len(found) == 1 and f"activation_checkpoint.{key} = " in found[0]["message"], (
            name, found)
        assert found[0]["line"] == next(n for n, line in enumerate(body.splitlines(), 1)
                                        if line.startswith(key)), name
    compiled = tmp_path / "compiled" / LLAMA3_8B.name
    compiled.parent.mkdir()
    compiled.write_text(cases["budget"][0].replace("enable=false", "enable=true"))
    assert read_config(compiled).settings.recompute == "op"
    assert not [f for f in _check(compiled, capsys)["findings"]
                if f["rule_id"] == "framework-refuses"]


def test_python_configs_name_the_policy_by_class() -> None:
    """0.3: SelectiveAC.Config() is op-level SAC, FullAC.Config() whole blocks, None none; a
    function that leaves it gets Trainer.Config's SelectiveAC. No 0.3 stack preset: the newest
    torchtitan one, said in a note."""
    configs = {p.label: p for p in parse_torchtitan_py(LLAMA3_PY, LLAMA3_PY.read_text())}
    text = LLAMA3_PY.read_text()
    assert "activation_checkpoint=SelectiveAC.Config()" in text
    assert "activation_checkpoint=FullAC.Config()" in text
    assert configs["llama3_8b"].settings.recompute == "op"
    assert configs["llama3_70b"].settings.recompute == "full"
    assert configs["llama3_405b"].settings.recompute == "full"
    for parsed in configs.values():
        assert parsed.settings.stack == "torchtitan@0.2"
        assert any(n.startswith("stack torchtitan@0.2 (the newest torchtitan preset; placer "
                                "has none for Python configs") for n in parsed.notes)
    none = text.replace("activation_checkpoint=FullAC.Config()", "activation_checkpoint=None")
    assert {p.label: p.settings.recompute for p in parse_torchtitan_py(LLAMA3_PY, none)}[
        "llama3_70b"] == "none"
    silent = ("def llama3_tiny() -> Trainer.Config:\n    return Trainer.Config(parallelism="
              "ParallelismConfig(tensor_parallel_degree=2))\n")
    [tiny] = parse_torchtitan_py(LLAMA3_PY, silent)
    assert tiny.settings.recompute == "op"


def test_megatron_configs_keep_no_stack() -> None:
    """The stack is the torchtitan dialect's: a Megatron launch script is priced as before."""
    data = Path(__file__).resolve().parent / "data" / "check"
    parsed = read_config(data / "megatron_llama3_8b_tp8.sh")
    assert parsed.settings.stack is None and parsed.settings.recompute_every is None
