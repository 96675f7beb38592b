"""The Kubeflow Training SDK reads every example candidate's pytorchjob.yaml; its ConfigMap fits.

kubeflow-training (the Training Operator v1 API client) deserialises the document into its own
``KubeflowOrgV1PyTorchJob`` and serialises it back unchanged (tests/frameworks/
kubeflow_accept.py). The job name is a DNS-1035 label with room for the operator's
``-worker-<i>`` service names. The header's ConfigMap commands run as written, from the launch
directory; ``kubectl`` (no cluster here: the one stub) records its arguments, and the ConfigMap
kubectl would build from them (one key per --from-file, non-UTF-8 files as binaryData) must
stay under Kubernetes' 1 MiB, and placer_mesh must read the rank map it carries.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers_frameworks import Case, example_cases, need, run_worker

from placer.launch.scripts import KUBE_CONFIGMAP_MAX_BYTES

# Each starts the framework in its own venv over every example candidate (tests/conftest.py).
pytestmark = pytest.mark.slow

# k8s.io/apimachinery/pkg/util/validation/validation.go, IsDNS1035Label.
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_LABEL_MAX = 63
FAKE_KUBECTL = """#!/bin/sh
printf '%s\\n' "$@" > "$KUBECTL_ARGS"
"""


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return example_cases()


def test_kubeflow_sdk_reads_every_pytorchjob(cases: list[Case], tmp_path: Path) -> None:
    version = need("kubeflow-training")
    results = run_worker("kubeflow_accept.py", [],
                         [{"id": c.id, "dir": str(c.folder)} for c in cases], tmp_path)
    for case in cases:
        got = results[case.id]
        assert "error" not in got, f"{case.id}: {got['error']}"
        assert got["round_trip"], f"{case.id}: fields the PyTorchJob API does not define"
        assert (got["api_version"], got["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
        nodes = len(json.loads((case.folder / "rankmap.json").read_text())["nodes"])
        assert got["replicas"] == ({"Master": 1, "Worker": nodes - 1} if nodes > 1
                                   else {"Master": 1}), case.id
        name = got["name"]
        longest_service = f"{name}-worker-{max(nodes - 2, 0)}"
        assert DNS_1035.fullmatch(name) and len(longest_service) <= DNS_LABEL_MAX, name
    print(f"kubeflow-training {version}: {len(cases)} PyTorchJobs read and written back")


def _header_commands(text: str) -> str:
    """Step 1 of pytorchjob.yaml's header: the shell lines after it, comment marks removed."""
    lines = [line.removeprefix("#") for line in text.splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith(" 1. "))
    end = next(i for i, line in enumerate(lines) if line.startswith(" 2. "))
    return "\n".join(line.strip() for line in lines[start + 1:end])


def _configmap_bytes(folder: Path, args: list[str]) -> tuple[int, list[str]]:
    """Data size of the ConfigMap kubectl builds from --from-file arguments, and its keys."""
    total, keys = 0, []
    for arg in args:
        if arg.startswith("--from-file="):
            path = folder / arg.removeprefix("--from-file=")
            raw = path.read_bytes()
            keys.append(path.name)
            try:
                total += len(raw.decode("utf-8").encode())  # data: the text
            except UnicodeDecodeError:
                total += len(raw)  # binaryData: counted as bytes by the API's validation
    return total, keys


def test_configmap_commands_run_and_fit(cases: list[Case], tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IEXEC)
    largest = 0
    for case in {c.plan.num_gpus: c for c in cases}.values():  # one per plan size
        record = tmp_path / f"{case.folder.name}.args"
        commands = _header_commands((case.folder / "pytorchjob.yaml").read_text())
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=case.folder,
                              env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
                                       KUBECTL_ARGS=str(record)),
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        args = record.read_text().split("\n")[:-1]
        assert args[:2] == ["create", "configmap"], args
        size, keys = _configmap_bytes(case.folder, args)
        assert {"launch.sh", "env.sh", "placer_mesh.py", "rankmap.json.gz"} <= set(keys)
        assert size < KUBE_CONFIGMAP_MAX_BYTES, (case.id, size)
        largest = max(largest, size)
        # A pod sees only the ConfigMap's files: placer_mesh reads the gzipped rank map.
        pod = tmp_path / f"{case.folder.name}-pod"
        pod.mkdir()
        for key in keys:
            (pod / key).write_bytes((case.folder / key).read_bytes())
        code = ("import json, sys, placer_mesh; m = placer_mesh.load_rankmap(); "
                "print(json.dumps(m['groups']))")
        read = subprocess.run([sys.executable, "-c", code], cwd=pod, capture_output=True,
                              text=True, timeout=120, check=False,
                              env=dict(os.environ, PYTHONPATH=str(pod)))
        assert read.returncode == 0, read.stderr
        expected = json.loads((case.folder / "rankmap.json").read_text())["groups"]
        assert json.loads(read.stdout) == expected
    print(f"largest ConfigMap: {largest:,} bytes of {KUBE_CONFIGMAP_MAX_BYTES:,}")
