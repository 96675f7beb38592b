"""``placer verify --slurm`` on a real one-node Slurm (tests/helpers_slurm.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers_cli import cli
from helpers_slurm import SlurmCluster, slurm_cluster

from placer.report.plan import plan_json
from placer.spec import Job, Model
from placer.verify.cpu_cluster import emulated_cluster
from placer.verify.plans import plan_for_layouts

__all__ = ["slurm_cluster"]


def test_fixture_allocates_fake_gpus_and_reports_exit(slurm_cluster: SlurmCluster,
                                                      tmp_path: Path) -> None:
    ok = tmp_path / "ok.sbatch"
    ok.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=2\n"
                  'srun --ntasks-per-node=1 bash -c \'echo "$SLURM_NODEID $CUDA_VISIBLE_DEVICES" '
                  '> out.txt\'\n')
    bad = tmp_path / "bad.sbatch"
    bad.write_text("#!/bin/bash\nexit 3\n")
    ok_id = slurm_cluster.sbatch(ok)
    bad_id = slurm_cluster.sbatch(bad)
    assert slurm_cluster.wait_job(ok_id)["JobState"] == "COMPLETED"
    record = slurm_cluster.wait_job(bad_id)
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "3:0")
    node_id, visible = (tmp_path / "out.txt").read_text().split()
    assert node_id == "0" and len(visible.split(",")) == 2


# Stands in for python3 on the compute node: candidate 1's torchrun never starts (a hang),
# candidate 2's exits 3 at once (a crash); every other candidate runs the real interpreter.
FAULTY_PYTHON = """#!/bin/bash
case "$*" in
  *candidate1/replay.json*) exec sleep {hang_s} ;;
  *candidate2/replay.json*) echo "RuntimeError: injected crash" >&2; exit 3 ;;
esac
exec {python} "$@"
"""
HANG_S = 3217  # a duration no other process here uses, to prove the hung job's tree is gone


def _sleepers(seconds: int) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", str(seconds).encode()]:
                pids.append(int(proc.name))
    return pids


def test_verify_slurm_times_out_a_hang_reports_a_crash_keeps_the_rest_and_resumes(
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=256, gated_mlp=False, vocab_size=512, tied_embeddings=True)
    plan = plan_for_layouts(model, emulated_cluster(1, 2, None),
                            Job(seq_len=128, global_batch_size=16),
                            [("tp=2,mbs=8", "tp", "TP"), ("dp=2,mbs=8", "dp", "DP"),
                             ("pp=2,mbs=4", "pp", "PP")])
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan_json(plan))
    faulty = tmp_path / "python"
    faulty.write_text(FAULTY_PYTHON.format(hang_s=HANG_S, python=sys.executable))
    faulty.chmod(0o755)
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    monkeypatch.setenv("PYTHON", str(faulty))
    work = tmp_path / "work"
    args = ["verify", str(plan_path), "--slurm", "--work-dir", str(work), "--top", "3",
            "--scale", "0.5", "--steps", "2", "--timeout-s", "40",
            "--partition", slurm_cluster.partition, "--out", str(tmp_path / "r.json"), "--force"]

    code, out, err = cli(args, capsys)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert code == 0, err
    assert [c["status"] for c in doc["candidates"]] == ["ok", "timeout", "failed"], out
    ok, hung, crashed = doc["candidates"]
    assert ok["measured_step_s"] > 0 and len(ok["measured_steps_s"]) == 2
    assert hung["error"].startswith("timeout (limit 40 s)")
    assert "FAILED, exit code 3:0" in crashed["error"], crashed["error"]
    assert "injected crash" in crashed["error"]
    first_ids = {i: json.loads((work / f"candidate{i}" / "slurm.json").read_text())["job_id"]
                 for i in range(3)}
    hung_job = slurm_cluster.wait_job(first_ids[1], timeout_s=30)
    assert hung_job["JobState"] == "CANCELLED"
    assert slurm_cluster.job(first_ids[0])["JobState"] == "COMPLETED"
    assert not _sleepers(HANG_S)

    monkeypatch.setenv("PYTHON", sys.executable)  # the "node" is fixed: rerun
    code, out, err = cli(args, capsys)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert code == 0, err
    assert [c["status"] for c in doc["candidates"]] == ["ok", "ok", "ok"], out
    assert "candidate 0" in out and "not re-run" in out
    again = {i: json.loads((work / f"candidate{i}" / "slurm.json").read_text())["job_id"]
             for i in range(3)}
    assert again[0] == first_ids[0]  # the finished candidate was not submitted again
    assert again[1] != first_ids[1] and again[2] != first_ids[2]
    assert doc["complete"] is True and doc["kendall_tau"] is not None


def test_a_refused_submission_is_reported_per_candidate(
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=256, gated_mlp=False, vocab_size=512, tied_embeddings=True)
    plan = plan_for_layouts(model, emulated_cluster(1, 2, None),
                            Job(seq_len=128, global_batch_size=16), [("tp=2,mbs=8", "tp", "TP")])
    (tmp_path / "plan.json").write_text(plan_json(plan))
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    code, out, _ = cli(["verify", str(tmp_path / "plan.json"), "--slurm", "--work-dir",
                        str(tmp_path / "w"), "--partition", "nosuchpartition"], capsys)
    assert code == 1
    assert "candidate 0" in out and "FAILED: failed: sbatch NOT_SUBMITTED" in out, out
    assert "invalid partition" in out.lower(), out


def test_real_model_candidates_run_as_slurm_jobs_and_resume(
        slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    model = Model(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4,
                  ffn_hidden_size=192, vocab_size=512)
    plan = plan_for_layouts(model, emulated_cluster(1, 2, None),
                            Job(seq_len=64, global_batch_size=4),
                            [("tp=2,mbs=2", "tp", "TP"), ("tp=2,mbs=1,sp=on", "tp", "SP")])
    (tmp_path / "plan.json").write_text(plan_json(plan))
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.env["SLURM_CONF"])
    args = ["verify", str(tmp_path / "plan.json"), "--slurm", "--real-model", "--work-dir",
            str(tmp_path / "w"), "--steps", "1", "--warmup-steps", "0", "--top", "2",
            "--out", str(tmp_path / "r.json"), "--force"]
    code, out, err = cli(args, capsys)
    assert code == 0, err + out
    doc = json.loads((tmp_path / "r.json").read_text())
    tp = next(c for c in doc["candidates"] if "sp=off" in c["layout_text"])
    sp = next(c for c in doc["candidates"] if "sp=on" in c["layout_text"])
    assert tp["status"] == "ok" and sp["status"] == "skipped"
    assert "sequence parallelism" in sp["error"]
    assert tp["peak_allocated_bytes"] > tp["static_bytes"] > 0 and tp["tokens_per_s"] > 0
    job_id = json.loads((tmp_path / "w" / f"model{tp['index']}" / "slurm.json").read_text())
    code, out, err = cli(args, capsys)
    assert code == 0 and "not re-run" in out, err + out
    again = json.loads((tmp_path / "w" / f"model{tp['index']}" / "slurm.json").read_text())
    assert again == job_id  # read back from the first run's results, not submitted again
    resumed = json.loads((tmp_path / "r.json").read_text())["candidates"][tp["index"]]
    assert (resumed["peak_allocated_bytes"], resumed["measured_step_s"]) == (
        tp["peak_allocated_bytes"], tp["measured_step_s"])
