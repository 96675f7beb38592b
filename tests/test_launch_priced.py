"""Framework files of a plan searched on another framework's stack say what they need there.

The README's llama3-70b example is a megatron-core@0.20 plan (zero=1, Megatron's fused kernels);
its torchtitan files run the layout as FSDP (zero=3, reshard never) with torchtitan's eager
PyTorch modules. The figures the notes quote are checked against two paths that do not go
through placer.launch: ``placer estimate --stack torchtitan@0.2`` of the layout written by hand
as torchtitan runs it, and ``placer check`` of the emitted file itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers_cli import cli
from helpers_launch import JOB, candidate, plan, small_cluster

from placer.launch import launch_files, render_bundle
from placer.launch.priced import framework_layout, stack_for
from placer.spec import Layout, Plan
from placer.spec.presets import model_preset, read_document, validated

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama3-70b-8x-dgx-h100" / "plan.json"
# the example's #1 (tp=4,pp=4,dp=2,cp=2,vpp=10,zero=1) as torchtitan runs the emitted file:
# FSDP (fsdp_reshard_after_forward = "never") for ZeRO-1, written by hand
TORCHTITAN_LAYOUT = "tp=4,pp=4,dp=2,cp=2,vpp=10,mbs=1,zero=3,recompute=none,sp=on,reshard=off"
PROBLEM = ["--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "8",
           "--seq-len", "8192", "--global-batch", "512"]
GIB = 2**30


def _unwrapped(text: str) -> str:
    """The file's notes (comment or docstring lines) joined, so wrapping does not matter."""
    return " ".join(line.lstrip("#").strip() for line in text.splitlines())


def _example() -> Plan:
    return validated(Plan, read_document(EXAMPLE), str(EXAMPLE))


def _estimate(capsys: pytest.CaptureFixture[str], stack: str, layout: str) -> dict[str, Any]:
    code, out, err = cli(["estimate", *PROBLEM, "--stack", stack, "--layout", layout, "--json"],
                         capsys)
    assert code == 0, err
    return dict(json.loads(out))


def _figure(est: dict[str, Any]) -> str:
    return (f"predicted at {est['peak_memory_bytes'] / GIB:.1f} of "
            f"{est['memory']['capacity_bytes'] / GIB:.1f} GiB usable per GPU")


def test_readme_example_torchtitan_files_do_not_fit_as_estimate_says(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_ = _example()
    assert plan_.job.stack == "megatron-core@0.20" and plan_.candidates[0].layout.zero_stage == 1
    est = _estimate(capsys, "torchtitan@0.2", TORCHTITAN_LAYOUT)
    assert est["fits"] is False  # 82.1 of 71.7 GiB at 9e3cc08
    figure = _figure(est)
    own = _estimate(capsys, "megatron-core@0.20", plan_.candidates[0].layout.compact())
    assert own["fits"] is True and own["step_time_s"] < est["step_time_s"]
    code, _, err = cli(["launch", str(EXAMPLE), "--out", str(tmp_path / "launch")], capsys)
    assert code == 0, err
    out = tmp_path / "launch"
    for name, version in (("torchtitan_config.py", "0.3"), ("torchtitan.toml", "0.2")):
        note = _unwrapped((out / name).read_text())
        assert (f"Priced for torchtitan {version}: the plan was searched for "
                "megatron-core@0.20; under torchtitan@0.2") in note, note
        assert f"{figure} (after the job's memory headroom): does not fit" in note, note
        assert (f"{est['step_time_s']:.1f} s per step ({own['step_time_s']:.1f} s on "
                "megatron-core@0.20, priced the same way)") in note, note
        assert ("placer recommend-layout --model llama3-70b --cluster dgx-h100 --nodes 8 "
                "--seq-len 8192 --global-batch 512 --stack torchtitan@0.2") in note, note
    readme = (out / "README.md").read_text()
    assert readme.count(f"{figure} (after the job's memory headroom): does not fit") == 2
    # Megatron's files are the plan's own stack's: no note
    assert "Priced for" not in (out / "megatron_args.sh").read_text()
    assert "Priced for" not in (out / "megatron_bridge_overrides.yaml").read_text()
    # one stderr line per file that does not fit
    warnings = [line for line in err.splitlines() if "does not fit" in line]
    assert [w.split(":")[1].strip() for w in warnings] == ["torchtitan.toml",
                                                           "torchtitan_config.py"], warnings
    gib = figure.removeprefix("predicted at ").removesuffix(" usable per GPU")
    assert all(f"needs {gib}" in w and "--stack torchtitan@0.2" in w for w in warnings), warnings


def test_check_of_the_emitted_file_agrees(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """placer check parses the written torchtitan file (its own reader, the torchtitan stack)
    and, with env.sh's allocator setting, predicts the peak the note quotes."""
    out = tmp_path / "launch"
    assert cli(["launch", str(EXAMPLE), "--out", str(out)], capsys)[0] == 0
    code, text, err = cli(["check", str(out / "torchtitan_config.py"), "--model", "llama3-70b",
                           "--cluster", "dgx-h100", "--nodes", "8",
                           "--env", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"], capsys)
    assert code == 1 and "memory-over-capacity" in text + err, text + err
    peak = _estimate(capsys, "torchtitan@0.2", TORCHTITAN_LAYOUT)["peak_memory_bytes"] / GIB
    assert f"predicted peak {peak:.1f} GiB" in text + err, text + err


def test_same_plan_same_bytes() -> None:
    plan_ = _example()
    first = {f.name: f.text for f in launch_files(plan_)}
    second = {f.name: f.text for f in launch_files(plan_)}
    assert first == second


def _torchtitan_plan(layout: Layout, stack: str | None) -> Plan:
    model, cluster = model_preset("llama3-8b"), small_cluster(2, 8)
    job = JOB.model_copy(update={"stack": stack})
    return plan(model, cluster, [candidate(model, cluster, job, layout)], job=job)


def test_plan_searched_on_torchtitan_has_no_note_in_torchtitan_files() -> None:
    layout = Layout(tp=2, pp=1, dp=8, micro_batch_size=1, zero_stage=3, recompute="full",
                    sequence_parallel=True)
    made = render_bundle(_torchtitan_plan(layout, "torchtitan@0.2"))
    files = {f.name: f.text for f in made.files}
    assert "Priced for" not in files["torchtitan.toml"]
    assert "Priced for" not in files["torchtitan_config.py"]
    assert {p.file for p in made.prices} == {"megatron_args.sh",
                                             "megatron_bridge_overrides.yaml", "deepspeed.json"}
    # Megatron's files are priced on megatron-core@0.20, the only megatron preset
    megatron = _unwrapped(files["megatron_args.sh"])
    assert ("Priced for Megatron-LM 0.16: the plan was searched for torchtitan@0.2; under "
            "megatron-core@0.20 (placer has no megatron-core 0.16 preset; its newest)") in megatron
    assert made.warnings() == [p.warning() for p in made.prices if p.fits is False]


def test_a_layout_the_other_stack_does_not_run_is_not_priced() -> None:
    """DeepSpeed's pipeline engine has no virtual stages (deepspeed@0.19 layout_fields): the
    README says so instead of a figure, and launch does not warn."""
    layout = Layout(tp=2, pp=2, dp=4, vpp=2, micro_batch_size=1, zero_stage=1,
                    recompute="selective", sequence_parallel=True)
    made = render_bundle(_torchtitan_plan(layout, "megatron-core@0.20"))
    deepspeed = next(p for p in made.prices if p.file == "deepspeed.json")
    assert deepspeed.fits is None and "layout.vpp 2" in deepspeed.not_run
    readme = next(f.text for f in made.files if f.name == "README.md")
    assert "- `deepspeed.json`: Not priced for DeepSpeed 0.19" in readme
    assert all("deepspeed.json" not in w for w in made.warnings())


@pytest.mark.parametrize(("zero", "cp", "dp", "expected"), [
    (1, 1, 8, "zero=3"), (2, 1, 8, "zero=3"), (0, 2, 4, "zero=3"), (0, 1, 8, "zero=0"),
])
def test_torchtitan_runs_zero_1_2_and_cp_as_fsdp(zero: int, cp: int, dp: int,
                                                 expected: str) -> None:
    """torchtitan.config writes ZeRO-1/2 as FSDP with reshard "never", and with cp > 1 and no
    ZeRO a data_parallel_shard_degree of 1, which torchtitan runs as FSDP over cp
    (ParallelDims.fsdp_enabled); selective is written as its op-level SAC."""
    layout = Layout(tp=2, pp=1, dp=dp, cp=cp, micro_batch_size=1, zero_stage=zero,
                    recompute="selective", sequence_parallel=True)
    run = framework_layout(layout, "torchtitan")
    assert expected in run.compact() and run.recompute == "op"
    if zero in (1, 2):
        assert run.reshard_after_forward is False
    assert framework_layout(layout, "megatron") == layout


def test_stack_for_version() -> None:
    assert stack_for("torchtitan", "0.2") == ("torchtitan@0.2", "")
    assert stack_for("torchtitan", "0.3") == (
        "torchtitan@0.2", "placer has no torchtitan 0.3 preset; its newest before it")
    assert stack_for("deepspeed", "0.19") == ("deepspeed@0.19", "")
    assert stack_for("megatron-bridge", "0.3") is None


def test_the_fix_command_gives_a_plan_torchtitan_fits(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The note's command, run as written (with --json), searches on torchtitan@0.2: its
    launch has torchtitan files with no note and no warning."""
    out = tmp_path / "launch"
    assert cli(["launch", str(EXAMPLE), "--out", str(out)], capsys)[0] == 0
    note = _unwrapped((out / "torchtitan_config.py").read_text())
    command = note.split("`placer ")[1].split("`")[0].split()
    assert command[0] == "recommend-layout" and command[-2:] == ["--stack", "torchtitan@0.2"]
    code, text, err = cli([*command, "--no-what-if", "--json"], capsys)
    assert code == 0, err
    (tmp_path / "plan.json").write_text(text)
    code, _, err = cli(["launch", str(tmp_path / "plan.json"), "--out", str(tmp_path / "t")],
                       capsys)
    assert code == 0 and "does not fit" not in err, err
    for name in ("torchtitan.toml", "torchtitan_config.py"):
        assert "Priced for" not in (tmp_path / "t" / name).read_text()
    assert "Priced for Megatron-LM 0.16" in _unwrapped((tmp_path / "t" / "megatron_args.sh")
                                                       .read_text())
