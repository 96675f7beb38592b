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


def _hub_cache_entry(root: Path, source: Path, *, main: bool = True) -> Path:
    """A Hub cache entry as huggingface.co/docs/hub/local-cache lays it out: the file in
    blobs/, snapshots/<commit>/config.json a relative link to it, refs/main the commit."""
    entry = root / "models--mistralai--Mixtral-8x7B-v0.1"
    commit = "ffe1a706bacbd5abddc5ff99432ee38f7e0662fb"
    (entry / "blobs").mkdir(parents=True)
    (entry / "blobs" / "3a1b0c").write_bytes((source / "config.json").read_bytes())
    (entry / "snapshots" / commit).mkdir(parents=True)
    (entry / "snapshots" / commit / "config.json").symlink_to("../../blobs/3a1b0c")
    if main:
        (entry / "refs").mkdir()
        (entry / "refs" / "main").write_text(commit)
    return entry


def test_a_hub_cache_entry_and_its_snapshot_read_the_config(tmp_path: Path) -> None:
    entry = _hub_cache_entry(tmp_path, HF / "mixtral-8x7b")
    expected = load_model(str(HF / "mixtral-8x7b" / "config.json"))
    for ref in (entry, next((entry / "snapshots").iterdir())):
        model = load_model(str(ref))
        # named after the repository, not the commit hash or blobs/ (where the link points)
        assert model.name == "Mixtral-8x7B-v0.1"
        assert model.model_dump(exclude={"name", "source"}) == expected.model_dump(
            exclude={"name", "source"})


def test_a_hub_cache_entry_with_two_snapshots_and_no_ref_names_one(tmp_path: Path) -> None:
    entry = _hub_cache_entry(tmp_path, HF / "mixtral-8x7b", main=False)
    other = entry / "snapshots" / ("0" * 40)
    other.mkdir()
    (other / "config.json").symlink_to("../../blobs/3a1b0c")
    with pytest.raises(InputError, match="several snapshots .*give one: "):
        load_model(str(entry))
