"""``placer recommend-layout`` end to end: real solver, real cost model, the real entry point."""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from pathlib import Path

import jsonschema
import pytest

from placer.cli import main
from placer.cost import estimate
from placer.cost.validity import MODEL_ERROR, unvalidated_mechanisms
from placer.mesh import MeshGrid
from placer.spec import Plan
from placer.spec.presets import cluster_preset, model_preset

ROOT = Path(__file__).resolve().parent.parent
BASE = ["recommend-layout", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "8"]
SMALL = ["recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100", "--top", "2",
         "--no-what-if"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the console entry point in process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


@pytest.fixture(scope="module")
def plan_text() -> str:
    """The --json output of the README's first command (computed once for the module)."""
    capture = pytest.MonkeyPatch()
    import io
    import sys

    buffer = io.StringIO()
    capture.setattr(sys, "stdout", buffer)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main([*BASE, "--json"])
    finally:
        capture.undo()
    assert exit_info.value.code == 0
    return buffer.getvalue()


def test_readme_command_prints_a_recommendation_with_its_defaults(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(BASE, capsys)
    assert code == 0, err
    assert "defaults used seq_len=8192" in out and "global_batch=512 sequences" in out
    assert "Top 5 layouts, best first" in out
    assert "Why #1:" in out and "- Best: TP=" in out and "- Links: TP=" in out
    assert re.search(r"- (Against|This is) the published recipe [a-z0-9]+-llama3-70b-64xh100", out)
    assert "stack=megatron-core@" in out  # the default stack is stated
    assert "- What would change the answer: at " in out or "- The answer holds at " in out
    assert "searched in" in err and "searched in" not in out


def test_no_what_if_skips_the_extra_searches(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(SMALL, capsys)
    assert code == 0 and "Why #1:" in out
    assert "What would change" not in out and "The answer holds" not in out


def test_human_output_is_byte_identical_across_runs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*SMALL, "--global-batch", "256"]
    first, second = run(argv, capsys), run(argv, capsys)
    assert first[0] == 0 and first[1] == second[1]


def test_json_validates_against_placer_schema_plan(plan_text: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, schema_text, _ = run(["schema", "plan"], capsys)
    assert code == 0
    data = json.loads(plan_text)
    jsonschema.validate(data, json.loads(schema_text))
    assert data["defaults_used"][0].startswith("seq_len=8192")
    assert data["job"]["global_batch_size"] == 512 and data["num_gpus"] == 64
    assert data["explanation"][0].startswith("Best: TP=")
    assert data["search"]["wall_s"] == 0.0


def test_json_candidates_are_best_first_with_rank_maps(plan_text: str) -> None:
    plan = Plan.model_validate_json(plan_text)
    # Best first: by step time, an unvalidated mechanism counted as slower by the model's error.
    times = [c.step_time_s * (1 + (MODEL_ERROR if unvalidated_mechanisms(c.layout, plan.job)
                                   else 0)) for c in plan.candidates]
    assert len(times) == 5 and times == sorted(times)
    for cand in plan.candidates:
        assert cand.fits and cand.layout.num_gpus == 64
        assert sorted(e.rank for e in cand.rank_map) == list(range(64))
        assert len({(e.node, e.gpu) for e in cand.rank_map}) == 64
        parts = sum(cand.breakdown.model_dump().values())
        assert parts == pytest.approx(cand.step_time_s, rel=1e-9)


def test_json_numbers_mean_what_the_cost_model_says(plan_text: str) -> None:
    plan = Plan.model_validate_json(plan_text)
    for cand in plan.candidates:
        grid = MeshGrid(cand.layout, tuple(cand.mesh_order))
        placement = [0] * cand.layout.num_gpus
        for entry in cand.rank_map:
            placement[grid.logical_index(entry.coords)] = entry.node * 8 + entry.gpu
        again = estimate(plan.model, plan.cluster, plan.job, cand.layout, order=cand.mesh_order,
                         placement=placement)
        assert again.step_time_s == pytest.approx(cand.step_time_s, rel=1e-9)
        assert again.peak_memory_bytes == cand.peak_memory_bytes
        assert again.mfu == pytest.approx(cand.mfu, rel=1e-9)
        assert again.breakdown == cand.breakdown


def test_json_fields_match_placer_estimate_json(plan_text: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    plan = Plan.model_validate_json(plan_text)
    best = plan.candidates[0]
    grid = MeshGrid(best.layout, tuple(best.mesh_order))
    natural = all(grid.logical_index(e.coords) == e.node * 8 + e.gpu for e in best.rank_map)
    if not natural:
        pytest.skip("the best candidate is not naturally placed; see the test above")
    code, out, err = run(["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes",
                          "8", "--layout", best.layout.compact(), "--order",
                          "-".join(best.mesh_order), "--json"], capsys)
    assert code == 0, err
    single = json.loads(out)
    ours = json.loads(plan_text)["candidates"][0]
    for key in ("layout", "mesh_order", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                "peak_memory_bytes", "fits", "breakdown", "memory", "links"):
        assert single[key] == ours[key], key


def test_json_is_byte_identical_and_only_json_on_stdout(
        plan_text: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*BASE, "--json"], capsys)
    assert code == 0 and out == plan_text
    assert "searched in" not in err


def test_constraints_bind_every_candidate(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--top", "3", "--constraint", "tp<=4", "--constraint",
                        "recompute=full", "--json", "--no-what-if"], capsys)
    assert code == 0
    plan = Plan.model_validate_json(out)
    assert [str(c) for c in plan.job.constraints] == ["tp<=4", "recompute=full"]
    assert all(c.layout.tp <= 4 and c.layout.recompute == "full" for c in plan.candidates)


def test_precision_reaches_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*SMALL, "--precision", "fp8", "--json"], capsys)
    assert code == 0 and Plan.model_validate_json(out).job.precision == "fp8"


def test_a_link_profile_feeds_the_cost_model(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "slow.yaml"
    profile.write_text("format: placer-link-profile/1\n"
                       "intra_node: {latency_s: 1.0e-4, bandwidth_bytes_per_s: 2.0e9}\n"
                       "inter_node: {latency_s: 1.0e-4, bandwidth_bytes_per_s: 1.0e9}\n")
    _, plain, _ = run([*SMALL, "--json"], capsys)
    code, slow, err = run([*SMALL, "--json", "--profile", str(profile)], capsys)
    assert code == 0, err
    fast_best = Plan.model_validate_json(plain).candidates[0]
    slow_best = Plan.model_validate_json(slow).candidates[0]
    assert slow_best.step_time_s > fast_best.step_time_s


def test_hf_config_json_works_as_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    config = ROOT / "tests" / "data" / "hf" / "llama-3-8b" / "config.json"
    code, out, err = run(["recommend-layout", "--model", str(config), "--cluster", "dgx-h100",
                          "--top", "2", "--json", "--no-what-if"], capsys)
    assert code == 0, err
    plan = Plan.model_validate_json(out)
    assert plan.model.num_layers == 32 and plan.defaults_used[0].startswith("nodes=1")


@pytest.mark.parametrize(("argv", "needle"), [
    (["--model", "llama9-1t", "--cluster", "dgx-h100"], "error: --model: 'llama9-1t'"),
    (["--model", "llama3-70b", "--cluster", "nope"], "error: --cluster: 'nope'"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "0"], "--nodes"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--top", "0"], "--top"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--constraint", "speed>3"],
     "error: --constraint: constraint 'speed>3' must look like 'tp<=8'"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--constraint", "tp<<4"],
     "error: --constraint 'tp<<4': tp takes a non-negative integer"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--profile", "missing.yaml"],
     "missing.yaml: no such file"),
    (["--model", "llama3-70b", "--cluster", "dgx-h100", "--bogus"], "No such option"),
    (["--cluster", "dgx-h100"], "Missing option '--model'"),
    (["--model", "llama3-405b", "--cluster", "dgx-h100", "--nodes", "1"], "error:"),
])
def test_bad_flags_and_inputs_are_one_line_errors_with_exit_code_2(
        argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["recommend-layout", *argv], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err


def test_bad_cluster_file_is_a_one_line_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("name: x\nnode_types: []\npools: []\n")
    code, _, err = run(["recommend-layout", "--model", "llama3-8b", "--cluster", str(bad)],
                       capsys)
    assert code == 2 and err.count("\n") == 1 and str(bad) in err


def test_emit_writes_the_plan_and_launch_files(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "emit"
    code, out, err = run([*SMALL, "--json", "--emit", str(out_dir)], capsys)
    assert code == 0, err
    plan_text = out
    assert (out_dir / "plan.json").read_text() == plan_text
    rankmap = json.loads((out_dir / "rankmap.json").read_text())
    assert rankmap["world_size"] == Plan.model_validate_json(plan_text).num_gpus
    names = {p.name for p in out_dir.iterdir()}
    assert {"plan.json", "rankmap.json", "launch.sh", "env.sh", "placer_mesh.py"} <= names
    assert os.stat(out_dir / "launch.sh").st_mode & stat.S_IXUSR
    assert f"wrote {out_dir / 'launch.sh'}" in err
    (out_dir / "plan.json").write_text("edited")
    code, _, err = run([*SMALL, "--json", "--emit", str(out_dir)], capsys)
    assert code == 2 and f"--emit: {out_dir} already has" in err and "pass --force" in err
    assert (out_dir / "plan.json").read_text() == "edited"
    code, _, _ = run([*SMALL, "--json", "--emit", str(out_dir), "--force"], capsys)
    assert code == 0 and (out_dir / "plan.json").read_text() == plan_text


def test_plot_writes_readable_pictures(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run([*SMALL, "--plot", str(tmp_path / "pics")], capsys)
    assert code == 0, err
    for name in ("rankmap.png", "breakdown.png"):
        data = (tmp_path / "pics" / name).read_bytes()
        width, height = struct.unpack(">II", data[16:24])
        assert data[:4] == b"\x89PNG" and width > 600 and height > 300 and len(data) > 20_000
    rank_svg = (tmp_path / "pics" / "rankmap.svg").read_text()
    assert "r7" in rank_svg and "TP group 0" in rank_svg and "GPU index on the node" in rank_svg
    chart = (tmp_path / "pics" / "breakdown.svg").read_text()
    # The baseline bar is the stack's published recipe or, with none that transfers, the rule.
    assert "#2" in chart and ("recipe" in chart or "rule" in chart)
    assert "predicted time per step (s)" in chart


def test_the_common_default_matches_the_cost_model() -> None:
    model = model_preset("llama3-70b")
    cluster = cluster_preset("dgx-h100").with_nodes(8)
    from placer.report.defaults import resolve_job
    from placer.report.plan import make_plan

    job, _ = resolve_job(model, seq_len=None, global_batch=None)
    rec = make_plan(model, cluster, job, top_k=2, with_what_ifs=False)
    assert rec.baseline is not None and rec.baseline.estimate is not None
    base = rec.baseline.estimate
    assert base == estimate(model, cluster, job, base.layout)
    assert rec.plan.candidates[0].step_time_s <= base.step_time_s * (1 + 1e-9)
