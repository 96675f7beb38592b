"""Preset names in any case, "did you mean", Hugging Face model folders, --gpu on a preset."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

from placer.errors import InputError
from placer.spec.presets import cluster_preset, gpu_preset, load_cluster, load_gpu, load_model
from placer.spec.stack import load_stack

HF = Path(__file__).resolve().parent / "data" / "hf"
ESTIMATE = ["estimate", "--layout", "tp=8,pp=8,dp=2,mbs=1,zero=1,recompute=selective,sp=on",
            "--model", "gpt3-175b", "--global-batch", "256"]


def test_names_ignore_case() -> None:
    assert load_model("Llama3-70B") == load_model("llama3-70b")
    assert load_cluster("DGX-H100") == cluster_preset("dgx-h100")
    assert load_gpu("h100-sxm-80gb") == gpu_preset("H100-SXM-80GB")
    assert load_stack("Megatron-Core@0.20") == load_stack("megatron-core@0.20")
    assert load_stack("TorchTitan") == load_stack("torchtitan@0.2")  # its newest preset


@pytest.mark.parametrize(("loader", "typo", "meant"), [
    (load_model, "lama3-70b", "llama3-70b"), (load_cluster, "dgx-h10", "dgx-h100"),
    (load_gpu, "H100-SXM", "H100-SXM-80GB"), (load_gpu, "h100", "H100-SXM-80GB"),
    (load_gpu, "H200", "H200-141GB"), (load_stack, "megatron", "megatron-core@0.20"),
    (load_stack, "titan", "torchtitan@0.2")])
def test_unknown_names_suggest_the_closest(loader, typo: str, meant: str) -> None:
    with pytest.raises(InputError) as info:
        loader(typo)
    assert f"did you mean {meant}" in str(info.value)


def test_a_hugging_face_model_folder_reads_its_config(tmp_path: Path) -> None:
    folder = tmp_path / "DeepSeek-V3"
    shutil.copytree(HF / "deepseek-v3", folder)
    from_folder = load_model(str(folder))
    assert from_folder == load_model(str(folder / "config.json"))
    assert from_folder.name == "DeepSeek-V3" and from_folder.moe is not None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception, match="without config.json"):
        load_model(str(empty))


def test_gpu_replaces_the_preset_clusters_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([*ESTIMATE, "--cluster", "dgx-a100", "--nodes", "16", "--gpu",
                          "a100-40gb", "--json"], capsys)
    assert code == 0, err
    code, preset_out, err = cli([*ESTIMATE, "--cluster", "dgx-a100-40gb", "--nodes", "16",
                                 "--json"], capsys)
    assert code == 0, err
    import json

    swapped, preset = json.loads(out), json.loads(preset_out)
    assert swapped["memory"] == preset["memory"] and swapped["step_time_s"] == preset[
        "step_time_s"]
    assert preset["memory"]["capacity_bytes"] < 40 * 2**30
    code, _, err = cli([*ESTIMATE, "--cluster", "dgx-a100", "--gpu", "A100-41GB"], capsys)
    assert_one_line_error(code, err)
    assert "did you mean A100-40GB" in err
