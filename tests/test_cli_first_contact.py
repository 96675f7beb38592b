"""A newcomer's first contact (issue #20): GPU names in cluster files and on --gpu, the hints of
bad-file errors, the what-if progress count and digit grouping, each through the real command
(``placer.cli.main``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers_cli import assert_one_line_error, cli

from placer.cli.recommend_command import _with_progress
from placer.report import progress
from placer.report.whatif import WhatIf
from placer.spec.presets import cluster_preset, gpu_names, gpu_preset

ESTIMATE = ["estimate", "--model", "llama3-8b", "--layout", "tp=8,pp=1,dp=1,mbs=1", "--json"]


def _cluster_file(tmp_path: Path, gpu: object, **changes: object) -> Path:
    """dgx-h100's preset as a user's cluster file, its node type's ``gpu`` set to ``gpu``."""
    data = cluster_preset("dgx-h100").model_dump(mode="json")
    data["node_types"][0]["gpu"] = gpu
    data.update(changes)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_cluster_files_gpu_name_ignores_case_as_presets_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, preset, err = cli([*ESTIMATE, "--cluster", "dgx-h100", "--nodes", "1"], capsys)
    assert code == 0, err
    path = _cluster_file(tmp_path, "h100-sxm-80gb", pools=[{"node_type": "dgx-h100",
                                                             "count": 1}])
    code, out, err = cli([*ESTIMATE, "--cluster", str(path)], capsys)
    assert code == 0, err
    ours, theirs = json.loads(out), json.loads(preset)
    assert ours["memory"] == theirs["memory"] and ours["step_time_s"] == theirs["step_time_s"]


@pytest.mark.parametrize(("name", "meant"), [
    ("H100", "H100-SXM-80GB"), ("H200 NVL", "H200-141GB"), ("A100 80GB", "A100-80GB"),
    ("h100_sxm", "H100-SXM-80GB")])
def test_a_cluster_files_unknown_gpu_name_gets_did_you_mean(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, meant: str) -> None:
    path = _cluster_file(tmp_path, name)
    code, _, err = cli([*ESTIMATE, "--cluster", str(path)], capsys)
    assert_one_line_error(code, err)
    assert f"{path}.node_types.0.gpu: {name!r} is not valid; did you mean {meant}" in err
    code, _, flag = cli([*ESTIMATE, "--cluster", "dgx-h100", "--gpu", name], capsys)
    assert_one_line_error(code, flag)  # the same rule as --gpu's
    assert f"did you mean {meant}" in flag and meant in gpu_names()


def test_gpu_says_what_it_takes_besides_a_preset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--gpu takes no file (a GPU file is refused), so the error does not offer one; what it
    offers instead, a cluster file whose gpu is a mapping of fields, works."""
    fields = {**gpu_preset("L40S").model_dump(mode="json"), "name": "RTX-5090"}
    gpu_file = tmp_path / "rtx-5090.yaml"
    gpu_file.write_text(yaml.safe_dump(fields))
    for ref in ("RTX 5090", str(gpu_file)):
        code, _, err = cli([*ESTIMATE, "--cluster", "dgx-h100", "--gpu", ref], capsys)
        assert_one_line_error(code, err)
        assert "or a file" not in err
        assert "a GPU not listed: a cluster file whose node type's gpu is a mapping" in err
    path = _cluster_file(tmp_path, fields, pools=[{"node_type": "dgx-h100", "count": 1}])
    code, out, err = cli([*ESTIMATE, "--cluster", str(path)], capsys)
    assert code == 0, err
    assert json.loads(out)["memory"]["capacity_bytes"] < fields["memory_bytes"]


def test_an_unknown_field_names_the_schema_that_lists_the_fields(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("seq_len: 4096\nglobal_batch_size: 64\nmemory_headrom: 0.1\n")
    code, _, err = cli(["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100",
                        "--job", str(job)], capsys)
    assert_one_line_error(code, err)
    assert err.strip() == (f"error: {job}.memory_headrom: unknown field; check its spelling "
                           "against `placer schema job`")
    code, out, err = cli(["schema", "job"], capsys)
    assert code == 0, err
    fields = json.loads(out)["properties"]
    assert "memory_headroom" in fields and "memory_headrom" not in fields


@pytest.mark.parametrize(("changes", "line"), [
    ({"pools": [{"node_type": "dgx-h200", "count": 2}]},
     ".pools.0.node_type: 'dgx-h200' is not a node type; use one of node_types' names "
     "(dgx-h100)"),
    ({"pools": [{"node_type": "dgx-h100", "count": 2}], "excluded_gpus": [{"node": 2, "gpu": 0}]},
     ".excluded_gpus.0.node: 2 does not exist; nodes are 0..1, counted over the pools in order"),
    ({"pools": [{"node_type": "dgx-h100", "count": 2, "hostnames": ["gpu-001"]}]},
     ".pools.0.hostnames: 1 given for count 2 nodes; give one per node"),
])
def test_a_check_across_fields_names_the_field_not_the_objects_repr(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, object],
        line: str) -> None:
    path = _cluster_file(tmp_path, "H100-SXM-80GB", **changes)
    code, _, err = cli([*ESTIMATE, "--cluster", str(path)], capsys)
    assert_one_line_error(code, err)
    assert err.strip() == f"error: {path}{line}"


def test_the_what_if_count_runs_unbroken(monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The second of three what-ifs is quick (its siblings were solved alongside it): once the
    first has shown its line, the second's shows too, not "1 of 3" then "3 of 3"."""
    monkeypatch.setattr(progress, "DELAY_S", 0.05)

    def solved(pauses_s: list[float]) -> Iterator[WhatIf]:
        for pause_s in pauses_s:
            time.sleep(pause_s)
            yield WhatIf(f"after {pause_s} s", None, None)

    assert len(list(_with_progress(solved([0.3, 0.0, 0.3]), 3, enabled=True))) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"placer: checking what would change the answer ({i} of 3) ..."
                     for i in (1, 2, 3)]
    assert len(list(_with_progress(solved([0.0, 0.0, 0.0]), 3, enabled=True))) == 3
    assert capsys.readouterr().err == ""  # quick ones stay silent


def test_counts_are_grouped_as_the_rest_of_the_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100",
                          "--nodes", "1", "--no-what-if", "--top", "1"], capsys)
    assert code == 0, err
    job = next(line for line in out.splitlines() if line.startswith("job "))
    # llama3-8b's 8,192-token default, 512 sequences of it the ~4M-token default batch
    assert job.split(None, 1)[1] == ("seq_len 8,192, global batch 512 sequences (4.19M "
                                     "tokens/step), bf16")
    code, out, err = cli(["estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100",
                          "--nodes", "128", "--global-batch", "1536", "--layout",
                          "tp=8,pp=8,dp=16,mbs=1,zero=1,recompute=selective,sp=on"], capsys)
    assert code == 0, err
    # 128 DGX A100 nodes of 8 GPUs
    assert out.startswith("gpt3-175b on dgx-a100 (1,024 GPUs), 1,536 x 2,048 tokens per step")
