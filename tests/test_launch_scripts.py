"""launch.sh, job.sbatch and pytorchjob.yaml: shellcheck-clean, and they do what they say.

The scripts run for real under bash with a stand-in for python (it prints the torchrun command
line and environment it receives), so node-rank selection, per-node process counts,
CUDA_VISIBLE_DEVICES and quoting are checked on the actual generated text.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers_launch import (
    JOB,
    candidate,
    mixed_cluster,
    plan,
    plan_2x2_tp_intra,
    plan_2x4_moe_remapped,
    plan_excluded_gpu,
)

from placer.cli.launch_command import load_plan
from placer.errors import InputError, PlacerError
from placer.launch import launch_bundle, launch_files, write_launch_files
from placer.launch.scripts import kubernetes_name
from placer.spec import Layout, Plan
from placer.spec.presets import cluster_names, cluster_preset, model_preset

SHELL_FILES = ("launch.sh", "env.sh", "job.sbatch", "megatron_args.sh")
ROOT = Path(__file__).resolve().parents[1]
# Every example folder that holds a recommend-layout plan (examples/regenerate.py writes them).
EXAMPLE_PLANS = sorted(ROOT.glob("examples/*/plan.json"))
SHELLCHECK = shutil.which("shellcheck")

FAKE_PYTHON = """#!/bin/bash
# Stand-in for python: print what torchrun would have been started with.
printf 'ARG %s\\n' "$@"
printf 'ENV CUDA_VISIBLE_DEVICES=%s\\n' "${CUDA_VISIBLE_DEVICES-<unset>}"
printf 'ENV PLACER_NODE_TYPE=%s\\n' "$PLACER_NODE_TYPE"
printf 'ENV PLACER_RANKMAP=%s\\n' "$PLACER_RANKMAP"
printf 'ENV NCCL_IB_HCA=%s\\n' "${NCCL_IB_HCA-<unset>}"
printf 'ENV PYTHONPATH=%s\\n' "$PYTHONPATH"
"""


def _mixed_plan() -> Plan:
    model, cluster = model_preset("llama3-8b"), mixed_cluster()
    layout = Layout(tp=4, pp=2, dp=2, vpp=2, zero_stage=3, recompute="full",
                    sequence_parallel=True)
    return plan(model, cluster, [candidate(model, cluster, JOB, layout,
                                           order=("tp", "cp", "pp", "dp"))])


def _preset_plan(name: str) -> Plan:
    cluster = cluster_preset(name).with_nodes(2)
    per_node = cluster.node_types[0].gpus_per_node
    tp = min(4, per_node)
    layout = Layout(tp=tp, dp=2 * per_node // tp, zero_stage=1, recompute="selective",
                    sequence_parallel=tp > 1)
    model = model_preset("llama3-8b")
    return plan(model, cluster, [candidate(model, cluster, JOB, layout)])


PLANS = {
    "2x2": plan_2x2_tp_intra,
    "moe-remapped": plan_2x4_moe_remapped,
    "excluded-gpu": plan_excluded_gpu,
    "mixed-pinned-hosts": _mixed_plan,
    **{f"preset-{name}": (lambda name=name: _preset_plan(name)) for name in cluster_names()},
}


def _write(p: Plan, folder: Path, **options: object) -> Path:
    write_launch_files(p, 0, folder, **options)  # type: ignore[arg-type]
    return folder


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed "
                    "(apt-get install shellcheck)")
@pytest.mark.parametrize("name", sorted(PLANS))
def test_generated_shell_passes_shellcheck(tmp_path: Path, name: str) -> None:
    for debug in (False, True):
        folder = _write(PLANS[name](), tmp_path / f"debug{debug}", debug=debug)
        done = subprocess.run([str(SHELLCHECK), "-x", *SHELL_FILES], cwd=folder,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("plan_path", EXAMPLE_PLANS, ids=lambda p: p.parent.name)
def test_every_example_plan_gets_every_file(tmp_path: Path, plan_path: Path) -> None:
    p = load_plan(plan_path)
    for index in range(len(p.candidates)):
        folder = tmp_path / f"candidate{index}"
        written = write_launch_files(p, index, folder)
        _, refused = launch_bundle(p, index)
        # Every file, less the framework files a version refuses (each named with its reason).
        assert len(written) + len(refused) == 12 and all(r.reason for r in refused)
        assert all(path.stat().st_size > 0 for path in written)
        if SHELLCHECK is not None:
            done = subprocess.run([SHELLCHECK, "-x", *SHELL_FILES], cwd=folder,
                                  capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stdout


def _run_launch(folder: Path, tmp_path: Path, env: dict[str, str], *args: str,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    base = {"PATH": os.environ["PATH"], "PYTHON": str(fake)}
    done = subprocess.run(["bash", str(folder / "launch.sh"), *args], env={**base, **env},
                          capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def _torchrun_args(out: str) -> list[str]:
    return [line[4:] for line in out.splitlines() if line.startswith("ARG ")]


def _env_of(out: str) -> dict[str, str]:
    pairs = (line[4:].split("=", 1) for line in out.splitlines() if line.startswith("ENV "))
    return dict(pairs)  # type: ignore[arg-type]


def test_launch_sh_runs_static_torchrun_with_per_node_counts(tmp_path: Path) -> None:
    folder = _write(plan_excluded_gpu(), tmp_path / "launch", script="train.py")
    for node, nproc, devices in ((0, "2", "0,1"), (1, "1", "1")):
        done = _run_launch(folder, tmp_path, {"NODE_RANK": str(node), "MASTER_ADDR": "10.0.0.1"},
                           "--lr", "3e-4")
        assert _torchrun_args(done.stdout) == [
            "-m", "torch.distributed.run", "--rdzv-backend", "static", "--nnodes", "2",
            "--node-rank", str(node), "--nproc-per-node", nproc, "--master-addr", "10.0.0.1",
            "--master-port", "29500", "--max-restarts", "0", "train.py", "--lr", "3e-4"]
        env = _env_of(done.stdout)
        assert env["CUDA_VISIBLE_DEVICES"] == devices
        assert env["PLACER_RANKMAP"] == str(folder / "rankmap.json")
        assert env["PYTHONPATH"] == str(folder)
        assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"


def test_launch_sh_node_rank_sources_and_modes(tmp_path: Path) -> None:
    folder = _write(plan_2x2_tp_intra(), tmp_path / "launch")
    kubeflow = _run_launch(folder, tmp_path, {"PET_NODE_RANK": "1", "MASTER_ADDR": "m"})
    assert "--node-rank\n1" in "\n".join(_torchrun_args(kubeflow.stdout))
    slurm = _run_launch(folder, tmp_path, {"SLURM_NODEID": "1", "MASTER_ADDR": "m",
                                           "PLACER_LOCAL_ADDR": "10.1.1.2"})
    args = _torchrun_args(slurm.stdout)
    assert args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--local-addr") + 1] == "10.1.1.2"
    gloo = _run_launch(folder, tmp_path, {"NODE_RANK": "0", "MASTER_ADDR": "m",
                                          "PLACER_BACKEND": "gloo"})
    assert _env_of(gloo.stdout)["CUDA_VISIBLE_DEVICES"] == ""
    inherit = _run_launch(folder, tmp_path, {"NODE_RANK": "0", "MASTER_ADDR": "m",
                                             "PLACER_DEVICES": "inherit"})
    assert _env_of(inherit.stdout)["CUDA_VISIBLE_DEVICES"] == "<unset>"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MASTER_ADDR": "m"}, "NODE_RANK='' is not valid; set it to this node's index 0..1"),
        ({"NODE_RANK": "2", "MASTER_ADDR": "m"}, "NODE_RANK='2' is not valid"),
        ({"NODE_RANK": "x;y", "MASTER_ADDR": "m"}, "NODE_RANK='x;y' is not valid"),
        ({"NODE_RANK": "0"}, "set MASTER_ADDR to the address of node 0"),
    ],
)  # fmt: skip
def test_launch_sh_refuses_bad_node_rank_or_master(tmp_path: Path, env: dict[str, str],
                                                  message: str) -> None:
    folder = _write(plan_2x2_tp_intra(), tmp_path / "launch")
    done = _run_launch(folder, tmp_path, env, check=False)
    assert done.returncode == 2
    assert message in done.stderr
    assert "ARG" not in done.stdout


def test_pinned_hosts_pick_node_rank_and_master_by_host_name(tmp_path: Path) -> None:
    folder = _write(_mixed_plan(), tmp_path / "launch")
    done = _run_launch(folder, tmp_path, {"SLURMD_NODENAME": "h100-node01.cluster.local",
                                          "SLURM_NODEID": "0"})
    args = _torchrun_args(done.stdout)
    assert args[args.index("--node-rank") + 1] == "1"
    assert args[args.index("--master-addr") + 1] == "a100-node01"
    env = _env_of(done.stdout)
    assert env["PLACER_NODE_TYPE"] == "dgx-h100"
    assert env["NCCL_IB_HCA"].startswith("=mlx5_0,mlx5_3,")
    stranger = _run_launch(folder, tmp_path, {"SLURMD_NODENAME": "other"}, check=False)
    assert stranger.returncode == 2
    assert "host other is not in the plan's hosts (a100-node01 h100-node01)" in stranger.stderr


def test_script_path_is_quoted_not_executed(tmp_path: Path) -> None:
    script = "my dir/it's $(touch pwned) `touch pwned2`.py"
    folder = _write(plan_2x2_tp_intra(), tmp_path / "launch", script=script)
    done = _run_launch(folder, tmp_path, {"NODE_RANK": "0", "MASTER_ADDR": "m"}, "a b")
    assert _torchrun_args(done.stdout)[-2:] == [script, "a b"]
    assert not list(tmp_path.rglob("pwned*"))


def test_hostile_values_in_the_plan_are_refused() -> None:
    p = plan_2x2_tp_intra()
    pool = p.cluster.pools[0].model_construct(node_type="box", count=2,
                                              hostnames=["node1", "node2; rm -rf ~"])
    cluster = p.cluster.model_copy(update={"pools": [pool]})
    with pytest.raises(InputError, match="hostname of node 1: 'node2; rm -rf ~' is not valid"):
        launch_files(p.model_copy(update={"cluster": cluster}))
    job = p.job.model_copy(update={"name": "$(reboot)"})
    with pytest.raises(InputError, match=r"job.name: '\$\(reboot\)' is not valid"):
        launch_files(p.model_copy(update={"job": job}))
    cluster = p.cluster.model_copy(update={"socket_ifname": "eth0 `id`"})
    with pytest.raises(PlacerError, match="socket_ifname"):
        launch_files(p.model_copy(update={"cluster": cluster}))
    with pytest.raises(PlacerError, match="--master-port"):
        launch_files(p, master_port=70000)


FAKE_SLURM = {
    "scontrol": '#!/bin/bash\n[[ "$1 $2" == "show hostnames" ]] && printf "gpu-a\\ngpu-b\\n"\n',
    # Run the step once per node, as srun would, with that node's SLURM_NODEID.
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
            'for id in $(seq 0 $((SLURM_JOB_NUM_NODES - 1))); do\n'
            '  echo "TASK $id"; SLURM_NODEID=$id "$@" || exit $?\ndone\n',
}


def test_sbatch_runs_launch_sh_once_per_node_with_head_node_master(tmp_path: Path) -> None:
    folder = _write(plan_2x4_moe_remapped(), tmp_path / "launch")
    text = (folder / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4" in text
    assert "#SBATCH --job-name=launch-test" in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(fake),
           "SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_SUBMIT_DIR": str(folder)}
    done = subprocess.run(["bash", str(folder / "job.sbatch"), "--steps", "10"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    tasks = done.stdout.split("TASK ")[1:]
    assert len(tasks) == 2
    for node, task in enumerate(tasks):
        args = _torchrun_args(task)
        assert args[args.index("--node-rank") + 1] == str(node)
        assert args[args.index("--master-addr") + 1] == "gpu-a"
        assert args[-2:] == ["--steps", "10"]


def test_pytorchjob_yaml_structure(tmp_path: Path) -> None:
    folder = _write(plan_2x4_moe_remapped(), tmp_path / "launch", master_port=23456)
    text = (folder / "pytorchjob.yaml").read_text()
    assert "It is NOT torchrun's default order" in text  # the remapping is explained
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert doc["metadata"]["name"] == "launch-test"
    assert doc["spec"]["nprocPerNode"] == "4"
    specs = doc["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Master": 1, "Worker": 1}
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
        assert container["command"] == ["bash", "/placer/launch.sh"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert {"name": "PLACER_DEVICES", "value": "inherit"} in container["env"]
        volume = spec["template"]["spec"]["volumes"][0]
        assert volume["configMap"]["name"] == "launch-test-placer-launch"
    single = _write(_preset_plan_single(), tmp_path / "single")
    doc = yaml.safe_load((single / "pytorchjob.yaml").read_text())
    assert list(doc["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def _preset_plan_single() -> Plan:
    cluster, model = cluster_preset("dgx-h100"), model_preset("llama3-8b")
    return plan(model, cluster, [candidate(model, cluster, JOB, Layout(tp=8))])


@pytest.mark.parametrize(("job", "name"), [("Llama_3.1-70B", "llama-3-1-70b"),
                                           ("placer-job", "placer-job"), ("__", "placer-job"),
                                           ("70b-run", "job-70b-run"), ("9", "job-9")])
def test_kubernetes_names_are_dns_1035_labels(job: str, name: str) -> None:
    assert kubernetes_name(job) == name
    # Kubernetes' IsDNS1035Label (k8s.io/apimachinery/pkg/util/validation/validation.go):
    # at most 63 characters of [a-z0-9-], starting with a letter, ending with a letter or digit.
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63


def _comments(p: Plan, name: str) -> str:
    """The comment text of one generated file, unwrapped into one line."""
    text = next(f.text for f in launch_files(p) if f.name == name)
    return " ".join(line.lstrip("#").strip() for line in text.splitlines()
                    if line.startswith("#"))


def test_placement_comments_explain_the_mechanism() -> None:
    natural = _comments(plan_2x2_tp_intra(), "launch.sh")
    assert "torchrun's default order already realises it" in natural
    for name in ("launch.sh", "pytorchjob.yaml"):  # job.sbatch runs launch.sh
        remapped = _comments(plan_2x4_moe_remapped(), name)
        assert "Mechanism: rank remapping" in remapped
        assert "4 of 8 ranks hold another grid point" in remapped
    excluded = _comments(plan_excluded_gpu(), "launch.sh")
    assert "leaves out GPU(s) 0 (failed or excluded)" in excluded
    sbatch = next(f.text for f in launch_files(_mixed_plan()) if f.name == "job.sbatch")
    assert "#SBATCH --nodelist=a100-node01,h100-node01\n" in sbatch
