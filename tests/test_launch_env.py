"""env.sh: values derived from the cluster and plan, evaluated by bash itself, per node type."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers_launch import (
    JOB,
    candidate,
    mixed_cluster,
    plan,
    plan_2x2_tp_intra,
    plan_2x4_moe_remapped,
    small_cluster,
)

from placer.launch import launch_files
from placer.spec import Cluster, Layout, Plan
from placer.spec.presets import cluster_preset, model_preset

DEBUG_ONLY = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "TORCH_NCCL_TRACE_BUFFER_SIZE",
              "TORCH_NCCL_DUMP_ON_TIMEOUT")
NEVER_EXPORTED = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE", "NCCL_P2P_DISABLE",
                  "NCCL_BUFFSIZE", "NCCL_MIN_NCHANNELS")


def _env_sh(p: Plan, debug: bool = False) -> str:
    return next(f.text for f in launch_files(p, debug=debug) if f.name == "env.sh")


def _sourced(text: str, tmp_path: Path, node_type: str | None = None) -> dict[str, str]:
    """Run bash on env.sh and return the variables it exported (what the job really gets)."""
    path = tmp_path / "env.sh"
    path.write_text(text)
    setup = f"PLACER_NODE_TYPE={node_type}; " if node_type else ""
    done = subprocess.run(["env", "-i", "bash", "-c", f"{setup}source {path} && env -0"],
                          capture_output=True, text=True, check=True, timeout=30)
    pairs = (item.split("=", 1) for item in done.stdout.split("\0") if "=" in item)
    return {k: v for k, v in pairs if k not in ("PWD", "SHLVL", "_", "PLACER_NODE_TYPE")}


def _preset_plan(name: str, layout: Layout, nodes: int = 2) -> Plan:
    cluster: Cluster = cluster_preset(name).with_nodes(nodes)
    model = model_preset("llama3-8b")
    return plan(model, cluster, [candidate(model, cluster, JOB, layout)])


def test_dgx_h100_two_nodes_gets_rail_settings(tmp_path: Path) -> None:
    p = _preset_plan("dgx-h100", Layout(tp=4, pp=2, dp=2, zero_stage=1, sequence_parallel=True))
    env = _sourced(_env_sh(p), tmp_path)
    assert env == {
        # The DGX H100 compute-port map (docs/sources.md 5.2), with '=' for exact names.
        "NCCL_IB_HCA": "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11",
        "NCCL_CROSS_NIC": "0",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        # The allocator the plan's memory estimate assumed (placer/spec/runtime.py).
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def test_every_export_has_a_reason_and_debug_variables_need_debug(tmp_path: Path) -> None:
    p = plan_2x4_moe_remapped()
    for debug in (False, True):
        text = _env_sh(p, debug)
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith("export "):
                assert lines[i - 1].lstrip().startswith("# "), line
        env = _sourced(text, tmp_path)
        assert env["NCCL_SOCKET_IFNAME"] == "=eth0"
        for name in DEBUG_ONLY:
            assert (name in env) == debug, name
        assert env.get("NCCL_DEBUG", "INFO") == "INFO"
        for name in NEVER_EXPORTED:
            assert name not in env, name
    debug_text = _env_sh(p, True)
    assert "# export NCCL_ALGO=NVLS,Ring" in debug_text  # the estimate's algorithms, commented
    assert "# export NCCL_NVLS_ENABLE=0" in debug_text


@pytest.mark.parametrize(
    ("cluster_name", "layout", "why"),
    [
        ("dgx-h100", Layout(tp=1, dp=16, zero_stage=1), None),
        ("dgx-h100", Layout(tp=4, dp=4, zero_stage=3), "zero=3 (Megatron-FSDP"),
        ("dgx-h100", Layout(tp=4, dp=4, zero_stage=2), "zero=2 (Megatron-FSDP"),
        ("dgx-b200", Layout(tp=4, dp=4, zero_stage=1), "Blackwell"),
        ("gb200-nvl72", Layout(tp=4, dp=2, zero_stage=1), "Blackwell"),
    ],
)  # fmt: skip
def test_max_connections_only_where_megatron_needs_it(tmp_path: Path, cluster_name: str,
                                                      layout: Layout, why: str | None) -> None:
    text = _env_sh(_preset_plan(cluster_name, layout))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in _sourced(text, tmp_path)
    if why:
        assert "CUDA_DEVICE_MAX_CONNECTIONS is not set" in text and why in text


def test_single_node_sets_no_nic_variables(tmp_path: Path) -> None:
    p = _preset_plan("dgx-a100", Layout(tp=8), nodes=1)
    env = _sourced(_env_sh(p), tmp_path)
    assert "NCCL_IB_HCA" not in env and "NCCL_CROSS_NIC" not in env
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_roce_without_rails_gets_hca_but_no_cross_nic(tmp_path: Path) -> None:
    p = _preset_plan("pcie-8x-l40s", Layout(tp=2, dp=8, zero_stage=1))
    text = _env_sh(p)
    env = _sourced(text, tmp_path)
    assert env["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1"
    assert "NCCL_CROSS_NIC" not in env
    assert "NCCL_IB_GID_INDEX" in text and "NCCL_IB_GID_INDEX" not in env


def test_ethernet_cluster_has_no_hca(tmp_path: Path) -> None:
    model, cluster = model_preset("llama3-8b"), small_cluster(2, 2, kind="ethernet")
    p = plan(model, cluster, [candidate(model, cluster, JOB, Layout(tp=2, dp=2))])
    env = _sourced(_env_sh(p), tmp_path)
    assert "NCCL_IB_HCA" not in env
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def _mixed_plan() -> Plan:
    model, cluster = model_preset("llama3-8b"), mixed_cluster()
    return plan(model, cluster, [candidate(model, cluster, JOB, Layout(tp=8, dp=2, zero_stage=1))])


def test_mixed_cluster_picks_values_by_node_type(tmp_path: Path) -> None:
    text = _env_sh(_mixed_plan())
    a100 = _sourced(text, tmp_path, "dgx-a100")
    h100 = _sourced(text, tmp_path, "dgx-h100")
    assert a100["NCCL_IB_HCA"] == "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_6,mlx5_7,mlx5_8,mlx5_9"
    assert h100["NCCL_IB_HCA"] == "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11"
    assert a100["NCCL_SOCKET_IFNAME"] == h100["NCCL_SOCKET_IFNAME"] == "=ib0"
    path = tmp_path / "env.sh"
    done = subprocess.run(["bash", "-c", f"PLACER_NODE_TYPE=other; source {path}"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1
    assert "PLACER_NODE_TYPE must be one of: dgx-a100 dgx-h100" in done.stderr


def test_natural_plan_env_has_no_socket_ifname_but_says_how(tmp_path: Path) -> None:
    text = _env_sh(plan_2x2_tp_intra())
    assert "NCCL_SOCKET_IFNAME" not in _sourced(text, tmp_path)
    assert "NCCL_SOCKET_IFNAME is not set" in text
