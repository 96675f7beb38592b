"""placer calibrate / verify: flags, errors, fitting saved measurements, real-cluster recipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from placer.spec.profile import LinkProfile
from placer.verify.calibrate import coefficients, message_sizes

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "emulated-2x2"


def placer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placer", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)


def _one_error_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    for word in words:
        assert word in lines[0]


def test_user_errors_are_one_line() -> None:
    _one_error_line(placer("verify", "no/such/plan.json"), "no such file")
    _one_error_line(placer("verify", str(EXAMPLE / "plan.json"), "--save-profile", "p.yaml"),
                    "--calibrate")
    _one_error_line(placer("calibrate", "--inter-node-mbit", "400"), "--emulate")
    _one_error_line(placer("calibrate", "--emulate", "2y2"), "NODESxGPUS")
    _one_error_line(placer("verify", str(EXAMPLE / "plan.json"), "--scale", "0"), "--scale")
    _one_error_line(placer("calibrate", "--emit-config", "x"), "--cluster")


def _bench_file(path: Path) -> None:
    """Measurements of a link with known latency and bandwidth, as the worker writes them."""
    tests = []
    for section, alpha, bandwidth in (("intra_node", 1e-4, 1e9), ("inter_node", 2e-4, 5e7)):
        c1, c2 = coefficients("all_reduce", 2)
        tests.append({"link_class": section, "collective": "all_reduce", "group_size": 2,
                      "ranks": [0, 2], "points": [
                          {"size_bytes": s, "times_s": [c1 * alpha + c2 * s / bandwidth] * 3}
                          for s in message_sizes(16 << 20)]})
    gemm = [{"n": n, "times_s": [2 * n**3 / 2e10] * 3} for n in (128, 256, 512)]
    path.write_text(json.dumps({"format": "placer-bench/1", "world_size": 4, "backend": "gloo",
                                "collectives": tests, "gemm": {"0": gemm}}))


def test_calibrate_from_saved_measurements(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    _bench_file(bench)
    out = tmp_path / "profile.yaml"
    done = placer("calibrate", "--from", str(bench), "--cluster",
                  str(EXAMPLE / "cluster.yaml"), "--json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    profile = LinkProfile.model_validate(json.loads(done.stdout))
    assert profile.inter_node is not None and profile.intra_node is not None
    assert profile.inter_node.bandwidth_bytes_per_s == 5e7
    assert profile.intra_node.latency_s == 1e-4
    assert LinkProfile.model_validate(yaml.safe_load(out.read_text())) == profile
    assert "residuals:" in done.stderr and f"wrote {out}" in done.stderr


def test_calibrate_writes_the_recipe_for_a_real_cluster(tmp_path: Path) -> None:
    done = placer("calibrate", "--emit-config", str(tmp_path), "--cluster", "dgx-h100")
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "bench_config.json").read_text())
    assert config["tests"] and config["gemm_sizes"][-1] == 16384
    assert max(config["tests"][0]["sizes_bytes"]) == 256 << 20
    assert "torchrun --nnodes 1 --nproc-per-node 8" in done.stdout
    assert "-m placer.verify.workers.bench" in done.stdout
    assert "placer calibrate --from" in done.stdout


def test_outputs_are_not_replaced_without_force(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    _bench_file(bench)
    out = tmp_path / "profile.yaml"
    out.write_text("mine\n")
    args = ["calibrate", "--from", str(bench), "--cluster", str(EXAMPLE / "cluster.yaml"),
            "--out", str(out)]
    refused = placer(*args)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "--out" in refused.stderr and "--force" in refused.stderr
    assert out.read_text() == "mine\n"
    replaced = placer(*args, "--force")
    assert replaced.returncode == 0, replaced.stderr
    assert LinkProfile.model_validate(yaml.safe_load(out.read_text())).inter_node is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "profile.yaml"]
    again = placer("calibrate", "--emit-config", str(tmp_path), "--cluster", "dgx-h100")
    assert again.returncode == 0, again.stderr
    twice = placer("calibrate", "--emit-config", str(tmp_path), "--cluster", "dgx-h100")
    assert twice.returncode == 2 and "bench_config.json" in twice.stderr
    plan = EXAMPLE / "plan.json"
    saved = tmp_path / "saved.yaml"
    saved.write_text("mine\n")
    verify = placer("verify", str(plan), "--calibrate", "--save-profile", str(saved))
    assert verify.returncode == 2 and "--save-profile" in verify.stderr
    assert saved.read_text() == "mine\n"


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    _bench_file(bench)
    folder = tmp_path / "profile.yaml"
    folder.mkdir()  # renaming a file over a folder fails
    done = placer("calibrate", "--from", str(bench), "--cluster", str(EXAMPLE / "cluster.yaml"),
                  "--out", str(folder), "--force")
    assert done.returncode == 2 and done.stderr.startswith("error: --out: cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "profile.yaml"]
    assert list(folder.iterdir()) == []


def test_candidates_that_cannot_run_here_are_named_before_any_calibration(
        tmp_path: Path) -> None:
    """A 1024-GPU plan on --emulate 2x2: one line per candidate, then an error at once (no
    namespaces, no calibration, no predicted step time of a replay that never ran)."""
    plan = ROOT / "examples" / "gpt3-175b-128x-dgx-a100" / "plan.json"
    done = placer("verify", str(plan), "--top", "2", "--emulate", "2x2")
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 2, done.stdout
    assert lines[0].startswith("candidate 0 cannot run here: the candidate runs 128 node(s) x 8")
    assert lines[1].startswith("candidate 1 cannot run here")
    assert done.stderr.startswith("error: --emulate 2x2: none of the top 2 candidates fits")
    assert "calibrat" not in done.stderr + done.stdout


def test_a_candidate_of_another_shape_is_skipped_without_a_prediction(tmp_path: Path) -> None:
    from placer.spec import Job, Model
    from placer.verify.cpu_cluster import emulated_cluster
    from placer.verify.output import render, results_document
    from placer.verify.plans import plan_for_layouts
    from placer.verify.runner import LocalLauncher
    from placer.verify.session import VerifyOptions, verify_plan

    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=256, gated_mlp=False, vocab_size=512, tied_embeddings=True)
    plan = plan_for_layouts(model, emulated_cluster(1, 4, None), Job(seq_len=128,
                            global_batch_size=16), [("tp=4,mbs=4", "tp", "TP")])

    class Refuses(LocalLauncher):
        def run(self, *args: object, **kwargs: object) -> object:
            raise AssertionError("a candidate of another shape must not run")

    options = VerifyOptions(top_k=1)
    results, summary, _ = verify_plan(plan, Refuses(2), None, options, tmp_path)
    assert [r.status for r in results] == ["skipped"]
    assert results[0].predicted_step_s is None
    assert "1 node(s) x 4 ranks (4 in all), but this machine, 2 ranks" in (results[0].error or "")
    table = render(results_document("p", "l", options, "s", results, summary, None))
    assert table[1].split()[3:6] == ["skipped", "-", "-"]


def test_output_folders_that_cannot_be_made_are_one_line_errors(tmp_path: Path) -> None:
    """--work-dir and --emit-config under a file: a user error before any run, no traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x\n")
    emulated = [str(EXAMPLE / "plan.json"), "--top", "1", "--emulate", "2x2",
                "--inter-node-mbit", "400"]
    _one_error_line(placer("verify", *emulated, "--work-dir", str(blocker / "w")),
                    "--work-dir: cannot make", "Not a directory")
    _one_error_line(placer("verify", *emulated, "--emit-config", str(blocker / "e")),
                    "--emit-config: cannot make")
    _one_error_line(placer("calibrate", "--emulate", "2x2", "--work-dir", str(blocker / "c")),
                    "--work-dir: cannot make")
