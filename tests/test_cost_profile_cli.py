"""The link profile file and ``placer estimate`` end to end (the real entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from placer.cli import main
from placer.cost import estimate
from placer.errors import PlacerError
from placer.spec import Job, Layout
from placer.spec.presets import cluster_preset, model_preset
from placer.spec.profile import load_link_profile

PROFILE = """\
format: placer-link-profile/1
cluster: dgx-h100
intra_node:
  latency_s: 5.0e-6
  bandwidth_bytes_per_s: 1.0e11
  collectives:
    all_reduce: {latency_s: 8.0e-6, bandwidth_bytes_per_s: 1.2e11}
inter_node:
  latency_s: 1.2e-5
  bandwidth_bytes_per_s: 1.0e10
gemm:
  max_efficiency: 0.4
"""


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_profile_loads_and_slows_the_estimate_down(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(PROFILE, encoding="utf-8")
    profile = load_link_profile(path)
    assert profile.intra_node is not None
    assert profile.intra_node.for_collective("all_reduce").bandwidth_bytes_per_s == 1.2e11
    assert profile.intra_node.for_collective("all_gather").bandwidth_bytes_per_s == 1.0e11
    cluster = cluster_preset("dgx-h100").with_nodes(2)
    job = Job(seq_len=4096, global_batch_size=32)
    layout = Layout(tp=4, dp=4, zero_stage=1, sequence_parallel=True)
    model = model_preset("llama3-8b")
    preset = estimate(model, cluster, job, layout)
    measured = estimate(model, cluster, job, layout, profile=profile)
    assert measured.breakdown.tp_exposed_s > 2 * preset.breakdown.tp_exposed_s
    assert measured.breakdown.compute_s > 1.5 * preset.breakdown.compute_s


@pytest.mark.parametrize(("text", "message"), [
    ("intra_node: {latency_s: 1e-6}", "bandwidth_bytes_per_s: required field is missing"),
    ("intra_node: {latency_s: 1e-6, bandwidth_bytes_per_s: 1e9, speed: 3}", "unknown field"),
    ("gemm: {max_efficiency: 1.5}", "gemm.max_efficiency"),
    ("- just\n- a list", "expected a mapping"),
])
def test_bad_profiles_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(PlacerError) as info:
        load_link_profile(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_estimate_json_has_the_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100",
                          "--nodes", "8", "--global-batch", "64", "--seq-len", "4096",
                          "--layout", "tp=8,pp=2,mbs=1,zero=1,recompute=selective,sp=on",
                          "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "peak_memory_bytes",
                "fits", "breakdown", "memory", "collectives"):
        assert key in data
    assert data["layout"]["dp"] == 4 and data["num_gpus"] == 64
    assert data["mesh_order"] == ["tp", "cp", "dp", "pp"]


def test_estimate_table_moe_fp8_and_a_subset_of_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                          "--nodes", "2", "--precision", "fp8", "--global-batch", "32",
                          "--layout", "tp=2,pp=1,dp=4,ep=8,mbs=1,zero=1,recompute=full,sp=on",
                          "--order", "tp-cp-ep-dp-pp"], capsys)
    assert code == 0, err
    assert "step breakdown" in out and "ep exposed" in out and "all_to_all" in out
    assert "runs on the first 8 of 16 GPUs" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--layout", "tp=3"], "--layout"),
    (["--nodes", "3", "--layout", "tp=8,pp=3,vpp=2"], "layout.vpp"),  # 80 layers, 6 chunks
    (["--layout", "tp=8,dp=8"], "needs 64 GPUs"),
    (["--layout", "tp=8", "--order", "tp-xx"], "mesh order"),
    (["--layout", "tp=8", "--profile", "/nonexistent/p.yaml"], "no such file"),
])
def test_estimate_bad_input_is_one_line_exit_2(capsys: pytest.CaptureFixture[str],
                                               argv: list[str], message: str) -> None:
    code, out, err = run(["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", *argv],
                         capsys)
    assert code == 2
    assert err.startswith("error:") and message in err and err.count("\n") == 1
