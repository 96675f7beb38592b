"""placer topology import: real `nvidia-smi topo -m` matrices and NCCL XML dumps -> NodeType."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from placer.cli import main
from placer.errors import PlacerError
from placer.spec.cluster import NodeType
from placer.spec.presets import cluster_preset, gpu_names, gpu_preset, load_cluster
from placer.topology.importers import import_topology, parse_topology, read_topology_file
from placer.topology.importers.gpu_links import GPU_LINKS, gpu_links
from placer.topology.importers.infer import ImportedNode

TOPO = Path(__file__).parent / "data" / "topo"
PLACER = Path(sys.executable).parent / "placer"


def _import(file: str, gpu: str | None = None, nic_rate_gbps: float | None = None) -> ImportedNode:
    path = TOPO / file
    return import_topology(read_topology_file(path), source=file, name="node", gpu=gpu,
                           nic_rate_gbps=nic_rate_gbps)


def _import_text(text: str, gpu: str | None = "A100-80GB") -> ImportedNode:
    return import_topology(text, source="topo.txt", name="node", gpu=gpu)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    code = info.value.code if isinstance(info.value.code, int) else 0
    return code, captured.out, captured.err


def _nic_map(imported: ImportedNode) -> list[tuple[str, list[int]]]:
    return [(nic.name, nic.gpus) for nic in imported.node_type.nics]


def _matrix(rows: list[str], extra_header: str = "") -> str:
    """A topo -m matrix from GPU rows of cells (labels and header added)."""
    n = len(rows)
    header = "\t" + "\t".join(f"GPU{i}" for i in range(n)) + extra_header
    return "\n".join([header] + [f"GPU{i}\t{row}" for i, row in enumerate(rows)]) + "\n"


# --- nvidia-smi topo -m: the four real matrices of docs/sources.md 8.2 ----------------------------

def test_dgx_a100_nvswitch_pairs_and_nic_legend() -> None:
    imported = _import("dgx_a100.txt", gpu="A100-80GB")
    node, fabric = imported.node_type, imported.node_type.fabric
    assert (node.gpus_per_node, fabric.kind, fabric.nvlink_generation) == (8, "nvswitch", 3)
    assert fabric.nvlink_bandwidth_bytes_per_s == 12 * 25e9  # NV12 x NVLink3 per link
    assert fabric.nvls is False and fabric.nvlink_domain_size == 8
    preset = cluster_preset("dgx-a100").node_types[0].fabric
    assert fabric.pcie_switch_groups == preset.pcie_switch_groups == [[0, 1], [2, 3], [4, 5],
                                                                      [6, 7]]
    assert fabric.nvlink_bandwidth_bytes_per_s == preset.nvlink_bandwidth_bytes_per_s
    # GPU0/1 on NUMA 3, GPU2/3 on NUMA 1, ...: four NUMA nodes, grouped by GPU order.
    assert fabric.numa_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # The compute NICs pair one-to-one with the GPUs of their PCIe switch; the storage card
    # (NIC8/NIC9, no GPU near it) is left out.
    assert _nic_map(imported) == [(f"mlx5_{k}", [k]) for k in range(8)]
    assert all(nic.rate_gbps == 400 for nic in node.nics)
    assert any("mlx5_8, mlx5_9" in note for note in imported.notes)
    assert any("400 Gb/s assumed" in note for note in imported.notes)
    assert imported.network_kind == "infiniband" and imported.network_kind_assumed


def test_hgx_h100_matches_the_dgx_h100_preset_fabric() -> None:
    imported = _import("hgx_h100_nv18.txt", gpu="H100-SXM-80GB")
    fabric = imported.node_type.fabric
    assert fabric.nvlink_bandwidth_bytes_per_s == 18 * 25e9  # NV18 x NVLink4 per link
    assert fabric == cluster_preset("dgx-h100").node_types[0].fabric
    # One PIX NIC per GPU; NIC3 and NIC4 are local to no GPU.
    assert _nic_map(imported) == [(f"NIC{k}", [g]) for g, k in enumerate([0, 1, 2, 5, 6, 7, 8,
                                                                          9])]


def test_real_tool_output_with_tabs_ansi_header_and_nic_legend() -> None:
    imported = _import("hgx_h100_nv18_legend.txt", gpu="H100-SXM-80GB")
    preset = cluster_preset("dgx-h100").node_types[0]
    assert _nic_map(imported) == [(nic.name, nic.gpus) for nic in preset.nics]
    plain = _import("hgx_h100_nv18.txt", gpu="H100-SXM-80GB")
    assert imported.node_type.fabric == plain.node_type.fabric


def test_pcie_only_server_matches_the_l40s_preset_fabric() -> None:
    imported = _import("pcie_8gpu.txt", gpu="L40S")
    fabric = imported.node_type.fabric
    assert fabric.kind == "pcie" and fabric.nvlink_bandwidth_bytes_per_s is None
    assert fabric == cluster_preset("pcie-8x-l40s").node_types[0].fabric
    assert imported.node_type.nics == [] and imported.network_kind == "none"
    assert imported.node_type.nvlink_domain_size == 1


def test_pcie_a100_with_nvlink_bridge_pairs() -> None:
    imported = _import("pcie_a100_nvlink_pairs.txt", gpu="A100-80GB")
    fabric = imported.node_type.fabric
    assert fabric.kind == "nvlink_bridge"
    assert fabric.nvlink_groups == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert fabric.nvlink_bandwidth_bytes_per_s == 12 * 25e9 and fabric.nvls is False
    assert fabric.pcie_switch_groups == []  # NODE/SYS only: no GPU shares a PCIe switch
    assert fabric.numa_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert imported.node_type.nvlink_domain_size == 2


def test_nic_rate_option_overrides_default_and_file() -> None:
    assert {n.rate_gbps for n in _import("dgx_a100.txt", "A100-80GB", 200).node_type.nics} == {200}
    imported = _import("h100_ibm_cpu0.xml", nic_rate_gbps=400)
    assert [n.rate_gbps for n in imported.node_type.nics] == [400]
    assert any("instead of the file's" in note for note in imported.notes)


@pytest.mark.parametrize(("file", "gpu", "message"), [
    ("hgx_h100_nv18.txt", "A100-80GB", "18 NVLinks per GPU but a A100-80GB has 12"),
    ("dgx_a100.txt", "L40S", "has none"),
    ("dgx_a100.txt", None, "--gpu is required"),
])
def test_gpu_that_cannot_match_the_matrix(file: str, gpu: str | None, message: str) -> None:
    with pytest.raises(PlacerError, match=message):
        _import(file, gpu=gpu)


def test_direct_nvlink_mesh_and_switched_pairs_are_told_apart() -> None:
    # HGX A100 4-GPU board: 4 links to each of 3 peers, no NVSwitch -> 12 links, no NVLS.
    mesh = _import_text(_matrix([" X \tNV4\tNV4\tNV4", "NV4\t X \tNV4\tNV4",
                                 "NV4\tNV4\t X \tNV4", "NV4\tNV4\tNV4\t X "]))
    fabric = mesh.node_type.fabric
    assert (fabric.kind, fabric.nvls, fabric.nvlink_bandwidth_bytes_per_s) == ("nvswitch", False,
                                                                                300e9)
    # Two H100s with 18 links between them: direct, 18 links each.
    pair = _import_text(_matrix([" X \tNV18", "NV18\t X "]), gpu="H100-SXM-80GB")
    assert pair.node_type.fabric.nvlink_bandwidth_bytes_per_s == 450e9
    assert pair.node_type.fabric.nvls is False


def test_partial_nvlink_mesh_splits_into_fully_linked_groups() -> None:
    rows = []
    for i in range(8):
        cells = []
        for j in range(8):
            if i == j:
                cells.append(" X ")
            elif i // 4 == j // 4:
                cells.append("NV2")
            elif abs(i - j) == 4:
                cells.append("NV1")
            else:
                cells.append("SYS")
        rows.append("\t".join(cells))
    fabric = _import_text(_matrix(rows)).node_type.fabric
    assert fabric.kind == "nvlink_bridge"
    assert fabric.nvlink_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert fabric.nvlink_bandwidth_bytes_per_s == 3 * 2 * 25e9  # 2 links to 3 peers in group
    assert fabric.numa_groups == []  # NVLink hides the PCIe path between 0 and 4: unknown


def test_old_driver_labels_and_soc() -> None:
    text = ("\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
            "GPU0\t X \tSOC\tPIX\t0-11\n"
            "GPU1\tSOC\t X \tSOC\t12-23\n"
            "mlx5_0\tPIX\tSOC\t X \n")
    imported = _import_text(text)
    assert imported.node_type.fabric.numa_groups == [[0], [1]]
    assert _nic_map(imported) == [("mlx5_0", [0])]


def test_single_gpu() -> None:
    imported = _import_text("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-15\t0\n")
    assert imported.node_type.gpus_per_node == 1 and imported.node_type.fabric.kind == "pcie"


@pytest.mark.parametrize(("text", "message"), [
    ("hello world\n", "not an `nvidia-smi topo -m` matrix"),
    ("", "not an `nvidia-smi topo -m` matrix"),
    ("name: dgx\ngpus: 8\n", "not an `nvidia-smi topo -m` matrix"),
    ("GPU0\t X \tNV12\nGPU1\tNV12\t X \n", "no header row"),
    (_matrix([" X \tNV12\tNV12", "NV12\t X ", "NV12\tNV12\t X "]), "row GPU1 has 2 cells"),
    (_matrix([" X \tNV12", "NV12\t X \tNV12\tPIX"]), "row GPU1 has 4 cells, more than"),
    (_matrix([" X \tNVX", "NVX\t X "]), "unknown cell 'NVX'"),
    (_matrix([" X \tFOO", "FOO\t X "]), "unknown cell 'FOO'"),
    (_matrix([" X \tNV0", "NV0\t X "]), "unknown cell 'NV0'"),
    (_matrix([" X \tNV12", "PIX\t X "]), "symmetric"),
    (_matrix([" X \tX", "X\t X "]), "X marks the diagonal only"),
    (_matrix([" X \tPIX", "PIX\t X "])[:-12], "no row for GPU1"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU0\t X \tPIX\nGPU1\tPIX\t X \n", "appears twice"),
    ("\tGPU0\tGPU2\nGPU0\t X \tPIX\n", "header column 'GPU2' is not valid"),
    ("\tGPU0\tCPU Affinity\tNUMA Thing\nGPU0\t X \t0\n", "unknown header column 'NUMA'"),
    ("\tGPU0\tNIC0\tFooBar\nGPU0\t X \tPIX\n", "row GPU0 has 2 cells but the header names 3"),
    ("\tGPU0\tNIC0\nGPU0\t X \tNV4\n", "a NIC has no NVLink"),
])
def test_malformed_matrix_is_one_line(text: str, message: str) -> None:
    with pytest.raises(PlacerError, match=message) as info:
        parse_topology(text, "topo.txt")
    assert "\n" not in str(info.value)


def test_legend_after_the_matrix_is_ignored() -> None:
    with_legend = (TOPO / "pcie_8gpu.txt").read_text() + "\nLegend:\n\n  X    = Self\n  NV#  = ..."
    assert parse_topology(with_legend, "t") == parse_topology((TOPO / "pcie_8gpu.txt").read_text(),
                                                              "t")


# --- NCCL topology XML (docs/sources.md 8.3) ------------------------------------------------------

def test_ibm_h100_snippet_one_gpu_through_four_nvswitches() -> None:
    imported = _import("h100_ibm_cpu0.xml")
    node, fabric = imported.node_type, imported.node_type.fabric
    assert node.gpu.name == "H100-SXM-80GB" and node.gpus_per_node == 1
    assert any("memory size cannot be read" in note for note in imported.notes)
    assert (fabric.kind, fabric.nvlink_generation, fabric.nvls) == ("nvswitch", 4, True)
    assert fabric.nvlink_bandwidth_bytes_per_s == (5 + 5 + 4 + 4) * 25e9
    assert fabric.pcie_bandwidth_bytes_per_s == 64e9  # "32.0 GT/s PCIe", width 0 -> x16
    assert [(n.name, n.rate_gbps, n.gpus) for n in node.nics] == [("mlx5_7", 200.0, [0])]
    assert imported.network_kind == "roce"  # class 0x020000: Ethernet


def test_ibm_h100_eight_gpus() -> None:
    imported = _import("h100_ibm_8gpu.xml")
    fabric = imported.node_type.fabric
    assert imported.node_type.gpus_per_node == 8 and fabric.nvlink_domain_size == 8
    assert fabric.numa_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert fabric.pcie_switch_groups == [[g] for g in range(8)]
    assert _nic_map(imported) == [(f"mlx5_{7 - g}", [g]) for g in range(8)]


def test_dgx_a100_xml_switch_tree_and_storage_card() -> None:
    imported = _import("dgx_a100_4gpu.xml")
    node, fabric = imported.node_type, imported.node_type.fabric
    assert node.gpu.name == "A100-80GB"
    assert fabric.nvlink_bandwidth_bytes_per_s == 6 * 2 * 25e9 and fabric.nvls is False
    assert fabric.pcie_bandwidth_bytes_per_s == 32e9  # "16.0 GT/s PCIe" x16
    assert fabric.pcie_switch_groups == [[0, 1], [2, 3]]
    assert fabric.numa_groups == [[0, 1], [2, 3]]
    assert [(n.name, n.rate_gbps, n.gpus) for n in node.nics] == [
        ("mlx5_0", 200.0, [0]), ("mlx5_1", 200.0, [1]), ("mlx5_2", 200.0, [2]),
        ("mlx5_3", 200.0, [3])]
    # The dual-port card sits on the CPU (PHB), under no GPU's switch.
    assert any("mlx5_4, mlx5_5" in note for note in imported.notes)
    assert imported.network_kind == "infiniband" and not imported.network_kind_assumed


def test_xml_pcie_relations_from_the_tree() -> None:
    host = parse_topology((TOPO / "dgx_a100_4gpu.xml").read_text(), "x")
    assert host.pcie[0][1] == "PXB" and host.pcie[0][2] == "SYS"
    assert [nic.relation for nic in host.nics if nic.name in ("mlx5_0", "mlx5_4")] == [
        ("PXB", "PXB", "SYS", "SYS"), ("PHB", "PHB", "SYS", "SYS")]
    bridged = parse_topology((TOPO / "pcie_a100_bridge_pairs.xml").read_text(), "x")
    assert bridged.pcie[0][1] == "PIX"


def test_xml_direct_nvlink_pairs() -> None:
    fabric = _import("pcie_a100_bridge_pairs.xml").node_type.fabric
    assert fabric.kind == "nvlink_bridge" and fabric.nvlink_groups == [[0, 1], [2, 3]]
    assert fabric.nvlink_bandwidth_bytes_per_s == 12 * 25e9


GB200_TRAY = """<system version="1">
  <cpu numaid="0" arch="aarch64">
    <pci busid="0008:01:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="100" rank="0" gdr="1">
        <nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/>
        <c2c bw="40" count="10"/>
      </gpu>
    </pci>
  </cpu>
</system>
"""


def test_grace_blackwell_with_rack_nvlink() -> None:
    imported = import_topology(GB200_TRAY, "gb200.xml", "tray")
    fabric = imported.node_type.fabric
    assert imported.node_type.gpu.name == "GB200"
    assert (fabric.nvlink_generation, fabric.nvlink_bandwidth_bytes_per_s) == (5, 18 * 50e9)
    assert any("nvlink_domain_size" in note for note in imported.notes)


@pytest.mark.parametrize(("text", "gpu", "message"), [
    (GB200_TRAY.replace('sm="100"', 'sm="103"'), None, "cannot tell the GPU from sm 103"),
    (GB200_TRAY, "H100-SXM-80GB", "sm 90 but the file's GPUs are sm 100"),
    ("<topology/>", None, "not <system>"),
    ("<system><cpu/></system>", None, "no <gpu> element"),
    (GB200_TRAY.replace('count="18"', 'count="many"'), None, "count='many'"),
    ("<system><cpu>", None, "invalid XML"),
])
def test_bad_xml_is_one_line(text: str, gpu: str | None, message: str) -> None:
    with pytest.raises(PlacerError, match=message) as info:
        import_topology(text, "topo.xml", "n", gpu=gpu)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("file", "message"), [
    ("dgx_a100_fragment.xml", "invalid XML"),  # the excerpt in docs/sources.md is not a document
    ("azure_ndv5_partial.xml", "partial NCCL_TOPO_FILE"),
])
def test_unusable_xml_samples(file: str, message: str) -> None:
    with pytest.raises(PlacerError, match=message):
        _import(file)


def test_every_catalog_gpu_has_link_data() -> None:
    """Every NVIDIA part can be imported; AMD parts (RCCL) are refused with a way out."""
    nvidia = [n for n in gpu_names() if gpu_preset(n).collectives_library == "nccl"]
    assert sorted(GPU_LINKS) == sorted(nvidia)
    amd = [n for n in gpu_names() if n not in nvidia]
    assert amd
    for name in amd:
        with pytest.raises(PlacerError, match="AMD GPU.*placer init cluster"):
            gpu_links(name)


# --- the command: files written, loaded back, errors -------------------------------------------

SAMPLES = [
    ("dgx_a100.txt", ["--gpu", "a100-80gb"]),  # preset names in any case
    ("hgx_h100_nv18.txt", ["--gpu", "H100-SXM-80GB"]),
    ("hgx_h100_nv18_legend.txt", ["--gpu", "H200-141GB"]),
    ("pcie_8gpu.txt", ["--gpu", "L40S"]),
    ("pcie_a100_nvlink_pairs.txt", ["--gpu", "A100-40GB"]),
    ("h100_ibm_cpu0.xml", []),
    ("h100_ibm_8gpu.xml", []),
    ("dgx_a100_4gpu.xml", []),
    ("pcie_a100_bridge_pairs.xml", []),
]


@pytest.mark.parametrize(("file", "options"), SAMPLES)
def test_written_yaml_loads_back(file: str, options: list[str], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    node_file, cluster_file = tmp_path / "node.yaml", tmp_path / "cluster.yaml"
    code, _, _ = _run(["topology", "import", str(TOPO / file), *options, "--name", "n1",
                       "--out", str(node_file)], capsys)
    assert code == 0
    node = NodeType.model_validate(yaml.safe_load(node_file.read_text()))
    assert node.name == "n1"
    code, out, _ = _run(["topology", "import", str(TOPO / file), *options, "--cluster",
                         "--nodes", "3", "--out", str(cluster_file)], capsys)
    assert code == 0 and "wrote cluster" in out
    cluster = load_cluster(str(cluster_file))
    assert cluster.node_types == [node.model_copy(update={"name": cluster.name})]
    assert cluster.num_nodes == 3 and cluster.num_gpus == 3 * node.gpus_per_node


def test_stdout_is_deterministic_yaml_with_notes_as_comments(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["topology", "import", str(TOPO / "dgx_a100.txt"), "--gpu", "A100-80GB"]
    first = _run(args, capsys)
    second = _run(args, capsys)
    assert first == second and first[0] == 0
    text = first[1]
    assert text.startswith("# placer node type imported from dgx_a100.txt (nvidia-smi topo -m)")
    assert "# NIC rate: the file gives none; 400 Gb/s assumed" in text
    assert yaml.safe_load(text)["name"] == "dgx_a100"


@pytest.mark.parametrize(("args", "message"), [
    (["missing.txt"], "missing.txt: no such file"),
    ([str(TOPO / "dgx_a100.txt")], "--gpu is required"),
    ([str(TOPO / "dgx_a100.txt"), "--gpu", "A100-80GB", "--nodes", "2"], "--nodes needs --cluster"),
    ([str(TOPO / "dgx_a100.txt"), "--gpu", "X100"], "--gpu: 'X100' is not valid"),
    ([str(TOPO / "dgx_a100.txt"), "--gpu", "a100"], "did you mean A100-40GB or A100-80GB?"),
    ([str(TOPO / "dgx_a100.txt"), "--gpu", "mi300x"], "MI300X is an AMD GPU"),
    ([str(TOPO / "dgx_a100.txt"), "--gpu", "A100-80GB", "--nic-rate-gbps", "-1"],
     "--nic-rate-gbps"),
    ([str(TOPO / "dgx_a100.txt"), "--gpu", "A100-80GB", "--name", "bad name"], "--name"),
    ([str(TOPO / "dgx_a100_fragment.xml")], "invalid XML"),
    ([str(TOPO / "azure_ndv5_partial.xml")], "partial NCCL_TOPO_FILE"),
])
def test_command_errors_are_one_line_exit_2(args: list[str], message: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "node.yaml"
    code, out, err = _run(["topology", "import", *args, "--out", str(out_file)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err
    assert not out_file.exists() and list(tmp_path.iterdir()) == []


def test_ragged_and_binary_files_via_the_installed_command(tmp_path: Path) -> None:
    ragged = tmp_path / "ragged.txt"
    lines = (TOPO / "pcie_8gpu.txt").read_text().splitlines()
    lines[4] = lines[4].replace("PXB", "", 1)
    ragged.write_text("\n".join(lines))
    binary = tmp_path / "topo.bin"
    binary.write_bytes(b"\xff\xfe\x00GPU0")
    cases = ((ragged, "row GPU3 has 10 cells; the header has 8 devices and 3 affinity"),
             (binary, "cannot read as UTF-8"))
    for path, message in cases:
        result = subprocess.run([str(PLACER), "topology", "import", str(path), "--gpu", "L40S"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
        assert message in result.stderr and "Traceback" not in result.stderr


def test_out_folder_must_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["topology", "import", str(TOPO / "pcie_8gpu.txt"), "--gpu", "L40S",
                         "--out", str(tmp_path / "no" / "node.yaml")], capsys)
    assert code == 2 and "does not exist" in err
