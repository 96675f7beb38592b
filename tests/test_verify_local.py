"""Workers under a real local torchrun (2 CPU ranks, gloo): calibration, replays, failures.

A hung or crashing candidate must be reported while the others still run, with its process tree
gone and the results of the others written as they arrive.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers_dist import process_alive

from placer.spec import Job, Model
from placer.verify.calibrate import CalibrationResult, Sweep, calibrate_from_bench, run_bench
from placer.verify.cpu_cluster import emulated_cluster
from placer.verify.output import results_document
from placer.verify.plans import plan_for_layouts
from placer.verify.runner import Launcher, LocalLauncher, RunResult
from placer.verify.session import CandidateResult, VerifyOptions, verify_plan

CLUSTER = emulated_cluster(1, 2, None)
SWEEP = Sweep(sizes_bytes=(4096, 256 << 10, 4 << 20), gemm_sizes=(64, 128), batches=2,
              min_batch_s=0.01, gemm_min_batch_s=0.02)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> CalibrationResult:
    work = tmp_path_factory.mktemp("calibrate")
    bench = run_bench(LocalLauncher(2), SWEEP, work, timeout_s=90)
    return calibrate_from_bench(bench, CLUSTER.node_types[0].gpu, CLUSTER.name, "local")


def test_local_calibration_measures_every_collective(calibration: CalibrationResult) -> None:
    fits = calibration.collectives
    assert {f.collective for f in fits} == {"all_reduce", "all_gather", "reduce_scatter",
                                            "all_to_all", "send_recv"}
    assert {f.link_class for f in fits} == {"intra_node"}  # one node: nothing crosses nodes
    assert all(len(f.points) == 3 and all(p.time_s > 0 for p in f.points) for f in fits)
    profile = calibration.profile
    assert profile.inter_node is None and profile.intra_node is not None
    assert profile.intra_node.bandwidth_bytes_per_s > 1e7  # loopback moves far more than 10 MB/s
    assert profile.gemm is not None and 0 < profile.gemm.max_efficiency <= 1


HANG = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(600)\n"
CRASH = "import sys\nsys.exit(3)\n"


class OneHangsOneCrashes(Launcher):
    """Runs the real replay for the first candidate, then a hanging and a crashing script."""

    def __init__(self, tmp: Path) -> None:
        self.inner = LocalLauncher(2)
        self.num_nodes, self.gpus_per_node = 1, 2
        self.description = self.inner.description
        self.tmp, self.calls = tmp, 0
        (tmp / "hang.py").write_text(HANG)
        (tmp / "crash.py").write_text(CRASH)

    def run(self, script_argv: list[str], log_dir: Path, timeout_s: float,
            env: dict[str, str] | None = None) -> RunResult:
        self.calls += 1
        if self.calls == 2:
            # Long enough for torchrun to start the hanging worker on a loaded 2-core box.
            return self.inner.run([str(self.tmp / "hang.py"), str(self.tmp / "pid")], log_dir,
                                  20.0)
        if self.calls == 3:
            return self.inner.run([str(self.tmp / "crash.py")], log_dir, timeout_s)
        return self.inner.run(script_argv, log_dir, timeout_s)


def test_failures_are_reported_and_the_others_still_run(calibration: CalibrationResult,
                                                        tmp_path: Path) -> None:
    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=256, gated_mlp=False, vocab_size=512, tied_embeddings=True)
    job = Job(seq_len=128, global_batch_size=16)
    choices = [("tp=2,mbs=8", "tp", "TP"), ("dp=2,mbs=8", "dp", "DP"),
               ("tp=2,mbs=4", "tp", "TP, smaller micro-batches")]
    plan = plan_for_layouts(model, CLUSTER, job, choices, calibration.profile)
    seen: list[CandidateResult] = []
    written: list[dict[str, Any]] = []

    def arrived(result: CandidateResult, so_far: list[CandidateResult]) -> None:
        seen.append(result)
        written.append(results_document("plan", "local", options, "p", so_far, None, None))

    options = VerifyOptions(top_k=3, scale=0.2, steps=2, candidate_timeout_s=90, refit=True)
    launcher = OneHangsOneCrashes(tmp_path)
    results, summary, fb = verify_plan(plan, launcher, calibration.profile, options,
                                       tmp_path / "work", arrived)
    assert [r.status for r in results] == ["ok", "timeout", "failed"]
    assert [r.index for r in seen] == [0, 1, 2]
    assert [len(d["candidates"]) for d in written] == [1, 2, 3]
    assert all(d["complete"] is False for d in written)
    ok = results[0]
    assert ok.measured_step_s is not None and ok.measured_step_s > 0
    assert len(ok.measured_steps_s) == 2 and ok.predicted_step_s > 0
    assert ok.op_measured_s and ok.gemm_call_measured_s
    assert (results[1].error or "").startswith("timeout")
    assert "exit codes" in (results[2].error or "")
    assert not process_alive(int((tmp_path / "pid").read_text()))
    assert summary["kendall_tau"] == 1.0 and summary["predicted_best"] == 0
    assert fb is not None and summary["after_calibration"]["predicted_best"] == 0
    doc = results_document("plan", "local", options, "p", results, summary, fb)
    assert doc["complete"] is True
    assert [c["status"] for c in doc["candidates"]] == ["ok", "timeout", "failed"]
    json.dumps(doc)
    launch = tmp_path / "work" / "candidate0" / "launch"
    assert (launch / "rankmap.json").is_file() and (launch / "placer_mesh.py").is_file()
    assert os.access(launch / "launch.sh", os.X_OK)


def test_replays_emitted_for_a_real_cluster_are_compared_from_their_folder(
        calibration: CalibrationResult, tmp_path: Path) -> None:
    """--emit-config writes the replays, the user's launcher runs them, --from compares."""
    import subprocess
    import sys

    from placer.report.plan import plan_json
    from placer.verify.calibrate import profile_yaml

    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=256, gated_mlp=False, vocab_size=512, tied_embeddings=True)
    plan = plan_for_layouts(model, CLUSTER, Job(seq_len=128, global_batch_size=16),
                            [("tp=2,mbs=8", "tp", "TP"), ("dp=2,mbs=8", "dp", "DP")],
                            calibration.profile)
    (tmp_path / "plan.json").write_text(plan_json(plan))
    (tmp_path / "profile.yaml").write_text(profile_yaml(calibration.profile))
    emitted = tmp_path / "emitted"

    def placer(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "placer", "verify", str(tmp_path / "plan.json"),
                "--profile", str(tmp_path / "profile.yaml"), "--scale", "0.2", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    done = placer("--emit-config", str(emitted))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("-m placer.verify.workers.replay") == 2
    # Run what was printed for candidate 0, a local torchrun standing in for the user's launcher;
    # candidate 1 is never run, so its folder has no results.
    config, out = emitted / "candidate0" / "replay.json", emitted / "candidate0" / "out"
    run = LocalLauncher(2).run(["-m", "placer.verify.workers.replay", str(config), str(out)],
                               tmp_path / "logs", 90)
    assert run.ok, run.log_tail
    done = placer("--from", str(emitted), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [c["status"] for c in doc["candidates"]] == ["ok", "failed"]
    assert doc["candidates"][0]["measured_step_s"] > 0
    assert "0 of 2 ranks wrote results" in doc["candidates"][1]["error"]
    done = placer("--from", str(emitted), "--scale", "0.5")
    assert done.returncode == 2 and "another plan, profile or --scale" in done.stderr
