"""Launchers: ``launch.sh`` (torchrun, static rendezvous), ``job.sbatch`` and ``pytorchjob.yaml``.

All three run the same ``launch.sh`` once per node, so the node-rank logic, the per-node process
counts and ``CUDA_VISIBLE_DEVICES`` live in one place. The static rendezvous with an explicit node
rank is used because torchrun's c10d rendezvous orders nodes by host name (docs/sources.md 1.3),
which would hand a node another node's rank block.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import yaml

from placer.launch.shell import bash_array, checked, comment_block, quote
from placer.mesh import order_text

if TYPE_CHECKING:  # recommend-layout reads the defaults below without rank maps
    from placer.launch.rankmap import PlacedCandidate

DEFAULT_MASTER_PORT = 29500
DEFAULT_SCRIPT = "train.py"
# Kubeflow Training Operator v1 constants (docs/sources.md 2.2).
KUBEFLOW_CONTAINER = "pytorch"
KUBEFLOW_PORT_NAME = "pytorchjob-port"
KUBEFLOW_MOUNT = "/placer"


def _hosts(placement: PlacedCandidate) -> list[str] | None:
    """Host names of the launch nodes, when the cluster file pins every one of them."""
    hosts = [checked(node.hostname, "hostname", f"hostname of node {node.cluster_node}")
             for node in placement.nodes if node.hostname is not None]
    return hosts if len(hosts) == len(placement.nodes) else None


def _is_uniform(placement: PlacedCandidate) -> bool:
    """Every node runs the same number of ranks on the same GPUs of the same node type."""
    first = placement.nodes[0]
    return all((n.gpus, n.node_type.name) == (first.gpus, first.node_type.name)
               for n in placement.nodes)


def placement_comment(placement: PlacedCandidate) -> list[str]:
    """Plain-language lines on how the rank map is realised (the mechanism and why)."""
    grid = placement.grid
    order = order_text([d for d in grid.order if grid.sizes[d] > 1] or ["tp"])
    lines = [f"Rank placement: mesh order {order_text(grid.order)} (innermost first), "
             f"{placement.world_size} ranks on {len(placement.nodes)} node(s)."]
    if placement.is_identity:
        lines.append(f"torchrun's default order already realises it: rank r holds grid point r "
                     f"(consecutive ranks differ first in {order.split('-')[0]}), as "
                     "init_device_mesh would build it.")
    else:
        moved = sum(1 for s in placement.slots if s.rank != s.logical)
        lines.append(
            f"It is NOT torchrun's default order ({moved} of {placement.world_size} ranks hold "
            "another grid point). Mechanism: rank remapping. placer_mesh.py builds the "
            "DeviceMesh from the explicit mesh tensor in rankmap.json, so each group contains "
            "the GPUs the plan chose although torchrun numbers ranks node by node.")
    for node in placement.nodes:
        healthy = placement.plan.cluster.healthy_gpus(node.cluster_node)
        left_out = sorted(set(range(node.node_type.gpus_per_node)) - set(node.gpus))
        if left_out:
            why = "failed or excluded" if set(left_out) - set(healthy) else "not used by the plan"
            lines.append(f"Node {node.index} runs {node.num_ranks} rank(s) on GPU(s) "
                         f"{node.cuda_visible_devices}: CUDA_VISIBLE_DEVICES leaves out "
                         f"GPU(s) {','.join(map(str, left_out))} ({why}), so local rank i "
                         "runs on the i-th listed GPU.")
    return lines


def render_launch_sh(placement: PlacedCandidate, script: str = DEFAULT_SCRIPT,
                     master_port: int = DEFAULT_MASTER_PORT) -> str:
    """The per-node torchrun launcher; every other launcher runs it."""
    plan = placement.plan
    nodes = placement.nodes
    hosts = _hosts(placement)
    job = quote(plan.job.name, "job", "job.name")
    nnodes = len(nodes)
    header = [
        f"launch.sh: start job {plan.job.name} (layout {placement.layout}) on this node.",
        f"Run it once on each of the {nnodes} node(s):",
        "  NODE_RANK=<0.." + str(nnodes - 1) + "> MASTER_ADDR=<address of node 0> ./launch.sh "
        "[training-script arguments]",
        "Node rank: $NODE_RANK, else $PET_NODE_RANK (Kubeflow), else "
        + ("this host's position in HOSTS below." if hosts else "$SLURM_NODEID (Slurm)."),
        "Master address: $MASTER_ADDR" + (", else HOSTS[0]." if hosts else "."),
        f"Optional: MASTER_PORT (default {master_port}), PLACER_SCRIPT (default "
        f"{script}), PYTHON (default python3), PLACER_LOCAL_ADDR (torchrun --local-addr), "
        "PLACER_DEVICES=inherit (keep the CUDA_VISIBLE_DEVICES a container runtime gave), "
        "PLACER_BACKEND=gloo (CPU dry run: no GPU visible, placer_mesh falls back to gloo).",
        "Static rendezvous with an explicit node rank: torchrun's c10d rendezvous orders nodes "
        "by host name (node10 before node2) and would give a node another node's rank block.",
        "",
        *placement_comment(placement),
    ]
    lines = ["#!/usr/bin/env bash", *comment_block(header), "set -euo pipefail", "",
             "# This script's folder; $(...) drops trailing newlines, which a folder name may",
             "# end with, so they are kept behind an x.",
             "src=${BASH_SOURCE[0]}",
             '[[ "$src" == */* ]] || src=./$src',
             'HERE=$(cd -- "${src%/*}/" && pwd && echo x)',
             "HERE=${HERE%$'\\n'x}",
             f"JOB={job}",
             f"NNODES={nnodes}",
             "# Per node rank: torchrun processes, GPUs in local-rank order, node type.",
             f"NPROC={bash_array(n.num_ranks for n in nodes)}",
             f"DEVICES={bash_array(n.cuda_visible_devices for n in nodes)}",
             "NODE_TYPES=" + bash_array(checked(n.node_type.name, "name", "node_type")
                                        for n in nodes)]
    if hosts:
        lines.append(f"HOSTS={bash_array(hosts)}")
    lines += ["", "node_rank=${NODE_RANK:-${PET_NODE_RANK:-}}"]
    if hosts:
        lines += [
            'if [[ -z "$node_rank" ]]; then',
            "  # Slurm's node name, else bash's own HOSTNAME (no external command needed).",
            '  self=${SLURMD_NODENAME:-${HOSTNAME:-}}',
            '  for i in "${!HOSTS[@]}"; do',
            '    if [[ "${HOSTS[$i]}" == "$self" || "${HOSTS[$i]%%.*}" == "${self%%.*}" ]]; then',
            "      node_rank=$i",
            "    fi",
            "  done",
            '  if [[ -z "$node_rank" ]]; then',
            '    echo "launch.sh: host $self is not in the plan\'s hosts (${HOSTS[*]});'
            ' set NODE_RANK" >&2',
            "    exit 2",
            "  fi",
            "fi",
        ]
    else:
        lines.append("node_rank=${node_rank:-${SLURM_NODEID:-}}")
    master_default = quote(hosts[0]) if hosts else ""
    lines += [
        'if ! [[ "$node_rank" =~ ^[0-9]+$ ]] || (( node_rank >= NNODES )); then',
        '  echo "launch.sh: NODE_RANK=\'$node_rank\' is not valid; set it to this node\'s index'
        ' 0..$((NNODES - 1)) (node 0 hosts the rendezvous)" >&2',
        "  exit 2",
        "fi",
        f"master_addr=${{MASTER_ADDR:-{master_default}}}",
        'if [[ -z "$master_addr" ]]; then',
        '  echo "launch.sh: set MASTER_ADDR to the address of node 0" >&2',
        "  exit 2",
        "fi",
        f"master_port=${{MASTER_PORT:-{master_port}}}",
        f"script=${{PLACER_SCRIPT:-{quote(script, 'script', '--script')}}}",
        "",
        'export PLACER_NODE_TYPE="${NODE_TYPES[$node_rank]}"',
        'if [[ -z "${PLACER_RANKMAP:-}" && ! -e "$HERE/rankmap.json"',
        '      && -e "$HERE/rankmap.json.gz" ]]; then',
        "  # The Kubernetes ConfigMap carries the rank map gzipped (ConfigMaps hold 1 MiB).",
        '  PLACER_RANKMAP="$HERE/rankmap.json.gz"',
        "fi",
        'export PLACER_RANKMAP="${PLACER_RANKMAP:-$HERE/rankmap.json}"',
        "# The training script imports placer_mesh from this directory.",
        'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"',
        "# shellcheck source=env.sh",
        'source "$HERE/env.sh"',
        'if [[ "${PLACER_BACKEND:-nccl}" == gloo ]]; then',
        "  # CPU dry run: hide every GPU so torch (and placer_mesh) fall back to gloo.",
        "  export CUDA_VISIBLE_DEVICES=",
        'elif [[ "${PLACER_DEVICES:-plan}" != inherit ]]; then',
        "  # Local rank i runs on the i-th GPU listed (placer_mesh sets the device from it).",
        '  export CUDA_VISIBLE_DEVICES="${DEVICES[$node_rank]}"',
        "fi",
        "",
        "args=(",
        "  --rdzv-backend static",
        '  --nnodes "$NNODES"',
        '  --node-rank "$node_rank"',
        '  --nproc-per-node "${NPROC[$node_rank]}"',
        '  --master-addr "$master_addr"',
        '  --master-port "$master_port"',
        "  --max-restarts 0",
        ")",
        'if [[ -n "${PLACER_LOCAL_ADDR:-}" ]]; then',
        '  args+=(--local-addr "$PLACER_LOCAL_ADDR")',
        "fi",
        'echo "launch.sh: job $JOB node $node_rank/$NNODES (${PLACER_NODE_TYPE}),'
        ' ${NPROC[$node_rank]} processes, master $master_addr:$master_port" >&2',
        "# python -m torch.distributed.run is torchrun, without depending on PATH.",
        'exec "${PYTHON:-python3}" -m torch.distributed.run "${args[@]}" "$script" "$@"',
    ]
    return "\n".join(lines) + "\n"


def render_sbatch(placement: PlacedCandidate) -> str:
    """Slurm batch script: one task per node, each running launch.sh."""
    plan = placement.plan
    nodes = placement.nodes
    hosts = _hosts(placement)
    gpus_per_node = max(n.num_ranks for n in nodes)
    directives = [
        "#!/bin/bash",
        f"#SBATCH --job-name={quote(plan.job.name, 'job', 'job.name')}",
        f"#SBATCH --nodes={len(nodes)}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
    ]
    if hosts:
        directives.append(f"#SBATCH --nodelist={','.join(hosts)}")
    notes = [
        f"job.sbatch: run job {plan.job.name} (layout {placement.layout}) under Slurm.",
        "Submit from this directory: sbatch job.sbatch [training-script arguments]",
        "One Slurm task per node; torchrun (in launch.sh) starts the per-GPU processes.",
    ]
    if hosts:
        notes.append("The plan pins its hosts: each task finds its node rank from its host name "
                     "in launch.sh (Slurm's SLURM_NODEID order need not match the plan's), and "
                     "node 0 of the plan hosts the rendezvous.")
    else:
        notes.append("Node rank = SLURM_NODEID; the head node (first of the allocation's node "
                     "list) hosts the rendezvous.")
        if not _is_uniform(placement):
            notes.append("WARNING: the plan's nodes differ (node types or healthy GPUs) but the "
                         "cluster file names no hosts, so Slurm decides which host gets which "
                         "part; add hostnames to the cluster file to pin them.")
    if not _is_uniform(placement):
        notes.append(f"--gpus-per-node is the largest per-node count ({gpus_per_node}); launch.sh "
                     "starts only as many processes as each node has planned GPUs.")
    lines = [*directives, *comment_block(notes), "set -euo pipefail", "",
             'HERE=${PLACER_LAUNCH_DIR:-${SLURM_SUBMIT_DIR:-$PWD}}']
    if not hosts:
        lines += ['mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
                  'MASTER_ADDR=${MASTER_ADDR:-${nodes[0]}}',
                  "export MASTER_ADDR"]
    lines += ["# --kill-on-bad-exit: one failed node ends the whole job instead of hanging it.",
              'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '
              'bash "$HERE/launch.sh" "$@"']
    return "\n".join(lines) + "\n"


# Files the pods read from the ConfigMap; the rank map goes gzipped (see KUBE_RANKMAP).
KUBE_FILES = ("launch.sh", "env.sh", "placer_mesh.py")
KUBE_RANKMAP = "rankmap.json.gz"
# Kubernetes caps a ConfigMap's data at 1 MiB (k8s.io/api core/v1 ConfigMap: "The total size of
# the data ... must be less than 1MiB"; apimachinery validation uses MaxSecretSize = 1 MiB).
KUBE_CONFIGMAP_MAX_BYTES = 1024 * 1024
# The operator names pods and services <job>-master-0 and <job>-worker-<i> (services are
# DNS-1035 labels of at most 63 characters), so the job name keeps room for that suffix.
KUBE_NAME_MAX = 50


def kubernetes_name(job_name: str) -> str:
    """A DNS-1035 label from the job name: lower-case letters, digits and '-', starting with a
    letter (the PyTorchJob's services are named after it, and Service names are DNS-1035)."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_name.lower()).strip("-")
    if name and not name[0].isalpha():
        name = "job-" + name
    return name[:KUBE_NAME_MAX].strip("-") or "placer-job"


def render_pytorchjob(placement: PlacedCandidate, master_port: int = DEFAULT_MASTER_PORT) -> str:
    """Kubeflow PyTorchJob (kubeflow.org/v1) whose pods run launch.sh from a ConfigMap."""
    plan = placement.plan
    nodes = placement.nodes
    name = kubernetes_name(plan.job.name)
    configmap = f"{name}-placer-launch"
    gpus = max(n.num_ranks for n in nodes)

    def replica(count: int) -> dict[str, object]:
        return {
            "replicas": count,
            "restartPolicy": "Never",
            "template": {"spec": {
                "containers": [{
                    "name": KUBEFLOW_CONTAINER,
                    "image": "REPLACE-WITH-YOUR-TRAINING-IMAGE",
                    "command": ["bash", f"{KUBEFLOW_MOUNT}/launch.sh"],
                    "env": [{"name": "PLACER_DEVICES", "value": "inherit"}],
                    "ports": [{"name": KUBEFLOW_PORT_NAME, "containerPort": master_port}],
                    # A resource.Quantity, which the API serialises as a string.
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    "volumeMounts": [{"name": "placer-launch", "mountPath": KUBEFLOW_MOUNT,
                                      "readOnly": True}],
                }],
                "volumes": [{"name": "placer-launch", "configMap": {"name": configmap}}],
            }},
        }

    specs: dict[str, object] = {"Master": replica(1)}
    if len(nodes) > 1:
        specs["Worker"] = replica(len(nodes) - 1)
    document = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"placer/job": name}},
        # runPolicy is required by the v1 API (the SDK's PyTorchJobSpec); cleanPodPolicy None is
        # the operator's own default (SetDefaults_*Job: "Set default cleanpod policy to None").
        "spec": {"nprocPerNode": str(gpus), "runPolicy": {"cleanPodPolicy": "None"},
                 "pytorchReplicaSpecs": specs},
    }
    notes = [
        f"pytorchjob.yaml: job {plan.job.name} (layout {placement.layout}) on Kubeflow "
        "(Training Operator v1).",
        "1. from this directory (the rank map goes gzipped: a ConfigMap holds at most 1 MiB):",
        "   gzip -9nkf rankmap.json &&",
        f"   kubectl create configmap {configmap} \\",
        "     " + " ".join(f"--from-file={f}" for f in KUBE_FILES) + " \\",
        f"     --from-file={KUBE_RANKMAP}",
        "2. set image to a training image that holds your script and torch, then "
        "kubectl apply -f pytorchjob.yaml",
        "Each pod runs launch.sh: node rank from PET_NODE_RANK (Master 0, Worker i = i+1), "
        "MASTER_ADDR/MASTER_PORT from the operator, static rendezvous. PLACER_DEVICES=inherit "
        "keeps the GPUs the device plugin assigned (physical indices do not apply in a pod).",
    ]
    if not _is_uniform(placement):
        notes.append(f"The plan's nodes differ in GPU count or type; one Worker template "
                     f"requests {gpus} GPUs per pod and launch.sh starts only the planned "
                     "number of processes per node rank. Pin pods to matching nodes.")
    notes += ["", *placement_comment(placement)]
    body = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=100)
    return "\n".join(comment_block(notes)) + "\n" + body
