"""One planning margin, not two: the allocator setting placer's launch exports is the one its
memory estimate assumes.

placer's env.sh exports PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so a job that does not
say how its launcher sets the allocator is planned without GMLake's fragmentation allowance
and keeps only the 10 % planning headroom; a job whose launcher runs without expandable segments
(``runtime.expandable_segments: false``) keeps the allowance, and its env.sh then leaves the
variable unset and says why.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers_cli import cli
from helpers_launch import candidate, plan

from placer.cost.memory import fragmentation_fraction, memory_estimate
from placer.launch import launch_files
from placer.spec import Job, Layout
from placer.spec.presets import cluster_preset, load_job, model_preset

LAYOUT = Layout(tp=2, dp=4, zero_stage=1, sequence_parallel=True)


def _job(expandable: bool | None) -> Job:
    runtime = {} if expandable is None else {"expandable_segments": expandable}
    return Job(name="alloc", seq_len=8192, global_batch_size=64, runtime=runtime)


def _exported(job: Job, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """env.sh for an 8-GPU llama3-8b plan of ``job``, and what bash exports from it."""
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100")
    p = plan(model, cluster, [candidate(model, cluster, job, LAYOUT)], job=job)
    text = next(f.text for f in launch_files(p) if f.name == "env.sh")
    path = tmp_path / "env.sh"
    path.write_text(text)
    done = subprocess.run(["env", "-i", "bash", "-c", f"source {path} && env -0"],
                          capture_output=True, text=True, check=True, timeout=30)
    pairs = (item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    return text, dict(pairs)


def test_a_job_that_does_not_say_is_planned_and_launched_with_expandable_segments(
        tmp_path: Path) -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100")
    planned = memory_estimate(model, cluster, _job(None), LAYOUT)
    assert planned.fragmentation_bytes == 0
    assert planned == memory_estimate(model, cluster, _job(True), LAYOUT)
    _, env = _exported(_job(None), tmp_path)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_a_launcher_without_expandable_segments_keeps_gmlakes_allowance(tmp_path: Path) -> None:
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100")
    stitched = memory_estimate(model, cluster, _job(None), LAYOUT)
    caching = memory_estimate(model, cluster, _job(False), LAYOUT)
    # GMLake: fragmentation is a fraction f of what the allocator reserves for the memory
    # allocated and freed step by step (activations, logits), none of the weights or optimizer
    # state; f is its no-recomputation figure here (LAYOUT recomputes nothing).
    dynamic = caching.activations_bytes + caching.logits_bytes + caching.moe_buffers_bytes
    reserved = dynamic + caching.fragmentation_bytes
    assert caching.fragmentation_bytes / reserved == pytest.approx(
        fragmentation_fraction(LAYOUT), rel=1e-6)
    assert caching.total_bytes - stitched.total_bytes == caching.fragmentation_bytes
    text, env = _exported(_job(False), tmp_path)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert "# PYTORCH_CUDA_ALLOC_CONF is not set" in text


def test_nvidias_8b_fp8_script_fits_as_it_ran_and_as_placer_would_launch_it() -> None:
    """NVIDIA/Megatron-LM@d98e8a6 examples/llama/train_llama3_8b_h100_fp8.sh runs on one DGX
    H100 without expandable segments: its layout must fit the whole GPU with the allowance, and
    as placer launches it (env.sh sets them) inside the planning headroom."""
    model, cluster = model_preset("llama3-8b"), cluster_preset("dgx-h100").with_nodes(1)
    layout = Layout(dp=8, zero_stage=1)
    script = load_job(Path(__file__).parent / "data" / "llama3_8b_fp8_job.yaml")
    assert script.runtime.expandable_segments is False
    as_ran = memory_estimate(model, cluster, script.model_copy(update={"memory_headroom": 0.0}),
                             layout)
    assert as_ran.fragmentation_bytes > 0
    assert as_ran.total_bytes <= as_ran.capacity_bytes  # the script ran
    placer_runtime = script.runtime.model_copy(update={"expandable_segments": None})
    planned = memory_estimate(model, cluster, script.model_copy(update={"runtime": placer_runtime}),
                              layout)
    assert planned.fragmentation_bytes == 0
    assert planned.total_bytes <= planned.capacity_bytes < as_ran.capacity_bytes


def test_the_report_states_the_allocator_it_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--seq-len", "8192", "--global-batch", "128", "--layout", "tp=1,dp=8,zero=1",
            "--json"]
    code, out, err = cli(base, capsys)
    assert code == 0, err
    assert any("expandable segments" in line for line in json.loads(out)["defaults_used"])
    job = Path(__file__).parent / "data" / "llama3_8b_fp8_job.yaml"  # says false
    code, out, err = cli([*base, "--job", str(job)], capsys)
    assert code == 0, err
    assert not any("expandable" in line for line in json.loads(out)["defaults_used"])
