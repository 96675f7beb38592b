"""The job knobs people change reach the job: --job, --global-batch-tokens, --memory-headroom,
--optimizer, --allow-tp-outside-nvlink; implausible batches and steps are warned about."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_cli import assert_one_line_error, cli

from placer.report.defaults import JobKnobs, resolve_job, step_time_warnings
from placer.spec.job import DEFAULT_MEMORY_HEADROOM, Job
from placer.spec.presets import gpu_preset, model_preset

ESTIMATE = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100",
            "--layout", "tp=1,dp=8,zero=1", "--json"]
GIB = 2**30


def _estimate(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    code, out, err = cli([*ESTIMATE, *args], capsys)
    assert code == 0, err
    return json.loads(out), err


def test_memory_headroom_in_gib_leaves_that_much_of_the_gpu(
        capsys: pytest.CaptureFixture[str]) -> None:
    gpu_bytes = gpu_preset("H100-SXM-80GB").capacity_bytes
    doc, _ = _estimate(["--memory-headroom", "6"], capsys)
    assert doc["memory"]["capacity_bytes"] == pytest.approx(gpu_bytes - 6 * GIB, abs=1)
    default, _ = _estimate([], capsys)
    assert default["memory"]["capacity_bytes"] == int(gpu_bytes * (1 - DEFAULT_MEMORY_HEADROOM))
    # "At least a few GiB on 80 GB parts" (issue 16): the default keeps 7.5 GiB back.
    assert gpu_bytes - default["memory"]["capacity_bytes"] > 7 * GIB


def test_global_batch_tokens_is_sequences_times_seq_len(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc, _ = _estimate(["--seq-len", "4096", "--global-batch-tokens", str(4 * 2**20)], capsys)
    assert doc["global_batch_size"] == 1024 and doc["seq_len"] == 4096


def test_optimizer_sets_the_state_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    adam, _ = _estimate([], capsys)
    lion, _ = _estimate(["--optimizer", "lion"], capsys)
    # ZeRO-1 over 8 ranks: master weights (4 B) + moments (8 B Adam, 4 B Lion) per parameter / 8.
    assert adam["memory"]["optimizer_bytes"] * 8 == pytest.approx(
        lion["memory"]["optimizer_bytes"] * 12, rel=1e-6)


def test_a_job_file_is_the_base_and_flags_override_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("seq_len: 4096\nglobal_batch_size: 128\nprecision: fp8\n"
                    "memory_headroom: 0.2\nconstraints: ['pp<=2']\n")
    doc, _ = _estimate(["--job", str(path)], capsys)
    assert (doc["seq_len"], doc["global_batch_size"], doc["precision"]) == (4096, 128, "fp8")
    gpu_bytes = gpu_preset("H100-SXM-80GB").capacity_bytes
    assert doc["memory"]["capacity_bytes"] == int(gpu_bytes * 0.8)
    assert not any(line.startswith(("seq_len", "global_batch")) for line in doc["defaults_used"])
    doc, _ = _estimate(["--job", str(path), "--precision", "bf16", "--global-batch", "64"],
                       capsys)
    assert (doc["precision"], doc["global_batch_size"]) == ("bf16", 64)
    job, _ = resolve_job(model_preset("llama3-8b"), seq_len=None, global_batch=None,
                         constraints=("tp<=4",), knobs=JobKnobs(job_file=path),
                         precision=None)
    assert [str(c) for c in job.constraints] == ["pp<=2", "tp<=4"]


def test_allow_tp_outside_nvlink_reaches_the_job() -> None:
    model = model_preset("llama3-8b")
    on, _ = resolve_job(model, seq_len=None, global_batch=None,
                        knobs=JobKnobs(allow_tp_outside_nvlink=True))
    off, _ = resolve_job(model, seq_len=None, global_batch=None)
    assert on.allow_tp_outside_nvlink and not off.allow_tp_outside_nvlink


@pytest.mark.parametrize(("args", "words"), [
    (["--global-batch-tokens", "1000"], ["--global-batch-tokens: 1000", "multiple of seq_len"]),
    (["--global-batch-tokens", "8192", "--global-batch", "4"], ["either --global-batch"]),
    (["--memory-headroom", "100"], ["--memory-headroom: 100.0", "between 0 and"]),
    (["--optimizer", "adamx"], ["adamx"]),
])
def test_bad_knobs_are_one_line_errors(args: list[str], words: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli([*ESTIMATE, *args], capsys)
    assert_one_line_error(code, err)
    for word in words:
        assert word in err


def test_a_batch_given_in_tokens_is_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    _, err = _estimate(["--seq-len", "8192", "--global-batch", "4194304"], capsys)
    assert err.startswith("warning: ")
    assert "probably meant --global-batch-tokens 4194304 (512 sequences)" in err
    _, quiet = _estimate(["--seq-len", "8192", "--global-batch", "512"], capsys)
    assert quiet == ""


def test_a_step_of_days_is_warned_about() -> None:
    job = Job(seq_len=8192, global_batch_size=4194304)
    assert step_time_warnings(496_693.0, job, 64)[0].startswith("the best layout takes 138.0 h")
    assert step_time_warnings(12.0, job, 64) == []


def test_overlaps_and_moe_imbalance_reach_the_runtime_and_the_step(
        capsys: pytest.CaptureFixture[str]) -> None:
    moe = ["--model", "mixtral-8x7b", "--layout", "tp=1,dp=8,ep=8,zero=1"]
    base = [a for a in ESTIMATE if a not in ("--model", "llama3-8b", "--layout",
                                             "tp=1,dp=8,zero=1")]
    times = []
    for imbalance in ("1.0", "2.0"):
        code, out, err = cli([*base, *moe, "--moe-imbalance", imbalance], capsys)
        assert code == 0, err
        times.append(json.loads(out)["step_time_s"])
    assert times[1] > times[0]  # the busiest expert rank sets the pace
    model = model_preset("llama3-8b")
    job, _ = resolve_job(model, seq_len=None, global_batch=None,
                         knobs=JobKnobs(overlaps="tp,dp_grad", moe_imbalance=1.5))
    assert job.runtime.overlaps == ("tp", "dp_grad") and job.runtime.moe_load_imbalance == 1.5
    none, _ = resolve_job(model, seq_len=None, global_batch=None, knobs=JobKnobs(overlaps="none"))
    assert none.runtime.overlaps == ()


def test_the_default_stack_is_stated_and_used() -> None:
    job, used = resolve_job(model_preset("llama3-8b"), seq_len=None, global_batch=None)
    assert job.stack is not None and job.stack.startswith("megatron-core@")
    assert any(line.startswith(f"stack={job.stack} ") and "set --stack" in line for line in used)
    chosen, used = resolve_job(model_preset("llama3-8b"), seq_len=None, global_batch=None,
                               knobs=JobKnobs(stack="torchtitan"))
    assert chosen.stack == "torchtitan" and not any(line.startswith("stack=") for line in used)
