"""Writing launch files: all-or-nothing, no overwrite without --force, and the CLI contract."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_launch import as_json, plan_2x2_tp_intra, plan_2x4_moe_remapped

import placer.io as writer
from placer.errors import PlacerError
from placer.launch import write_launch_files

EXPECTED = ["rankmap.json", "placer_mesh.py", "env.sh", "launch.sh", "job.sbatch",
            "pytorchjob.yaml", "megatron_args.sh", "megatron_bridge_overrides.yaml",
            "torchtitan.toml", "torchtitan_config.py",
            "deepspeed.json",
            "README.md"]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_writes_every_file_into_a_new_directory(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "launch"
    written = write_launch_files(plan_2x2_tp_intra(), 0, out)
    assert [p.name for p in written] == EXPECTED
    assert sorted(p.name for p in out.iterdir()) == sorted(EXPECTED)
    assert os.stat(out / "launch.sh").st_mode & stat.S_IXUSR
    assert not os.stat(out / "rankmap.json").st_mode & stat.S_IXUSR
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["launch"]  # no temp left over


def test_refuses_to_overwrite_without_force_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    out.mkdir()
    (out / "env.sh").write_text("# mine\n")
    (out / "notes.txt").write_text("keep me\n")
    with pytest.raises(PlacerError, match=r"already has env.sh; pass --force"):
        write_launch_files(plan_2x2_tp_intra(), 0, out)
    assert _snapshot(out) == {"env.sh": b"# mine\n", "notes.txt": b"keep me\n"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch"]


def test_force_replaces_generated_files_and_keeps_others(tmp_path: Path) -> None:
    out = tmp_path / "launch"
    write_launch_files(plan_2x2_tp_intra(), 0, out)
    (out / "notes.txt").write_text("keep me\n")
    write_launch_files(plan_2x4_moe_remapped(), 0, out, force=True)
    assert json.loads((out / "rankmap.json").read_text())["world_size"] == 8
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch"]


def test_failure_midway_leaves_no_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = writer._write_synced
    calls: list[Path] = []

    def flaky(path: Path, text: str, mode: int) -> None:
        calls.append(path)
        if len(calls) == 4:
            raise OSError(28, "No space left on device")
        real(path, text, mode)

    monkeypatch.setattr(writer, "_write_synced", flaky)
    with pytest.raises(PlacerError, match="No space left on device"):
        write_launch_files(plan_2x2_tp_intra(), 0, tmp_path / "launch")
    assert list(tmp_path.iterdir()) == []


def test_out_must_be_a_directory(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(PlacerError, match="exists and is not a directory"):
        write_launch_files(plan_2x2_tp_intra(), 0, target)


def test_same_plan_gives_identical_bytes(tmp_path: Path) -> None:
    write_launch_files(plan_2x4_moe_remapped(), 0, tmp_path / "a", debug=True)
    write_launch_files(plan_2x4_moe_remapped(), 0, tmp_path / "b", debug=True)
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")


def _placer(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placer", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, check=False)


def test_cli_launch_writes_files_and_refuses_overwrite(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(as_json(plan_2x4_moe_remapped())))
    done = _placer("launch", str(plan_file), "--out", "out", "--script", "pretrain.py",
                   "--master-port", "29600", "--debug", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ("wrote 12 files to out (framework versions: megatron 0.16, megatron-bridge 0.3, "
            in done.stdout)
    launch = (tmp_path / "out" / "launch.sh").read_text()
    assert "script=${PLACER_SCRIPT:-pretrain.py}" in launch
    assert "master_port=${MASTER_PORT:-29600}" in launch
    assert "export NCCL_DEBUG='INFO'" in (tmp_path / "out" / "env.sh").read_text()
    before = _snapshot(tmp_path / "out")
    again = _placer("launch", str(plan_file), "--out", "out", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.startswith("error: --out: out already has rankmap.json")
    assert len(again.stderr.strip().splitlines()) == 1
    assert _snapshot(tmp_path / "out") == before
    forced = _placer("launch", str(plan_file), "--out", "out", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "export NCCL_DEBUG" not in (tmp_path / "out" / "env.sh").read_text()


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("{not json", [], "invalid JSON"),
        ('{"format": "placer-plan/1"}', [], "required fields are missing: "),
        (None, ["--candidate", "3"], "--candidate: 3 is not valid"),
        (None, ["--script", "-m evil"], "--script: '-m evil' is not valid"),
    ],
)  # fmt: skip
def test_cli_user_errors_are_one_line(tmp_path: Path, content: str | None, args: list[str],
                                      message: str) -> None:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(content if content is not None else
                         json.dumps(as_json(plan_2x2_tp_intra())))
    done = _placer("launch", str(plan_file), "--out", "out", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
