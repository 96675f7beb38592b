"""The GPU catalog: every part validates and loads, every figure names its source, the parts added
for issue 20 run end to end on a preset cluster (--gpu), and AMD/V100 are handled as documented
(docs/sources.md 5.4)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from placer.cli import main
from placer.cost.profile import ceiling_notes, gemm_for, sm_count
from placer.errors import PlacerError
from placer.launch import require_nccl_gpus
from placer.report.defaults import resolve_gpu
from placer.spec.gpu import GPU
from placer.spec.presets import cluster_preset, gpu_names, gpu_preset, load_gpu

ADDED = ["H800", "A800-80GB", "H20", "L4", "B300", "GB300", "MI300X", "MI325X", "MI355X",
         "V100-SXM2-32GB", "RTX-4090"]
AMD = ["MI300X", "MI325X", "MI355X"]
FIGURES = ("memory_bytes", "usable_memory_bytes", "bf16_flops", "fp8_flops",
           "hbm_bandwidth_bytes_per_s", "mxfp8_tensor_cores")
SOURCES = Path(__file__).resolve().parents[1] / "docs" / "sources.md"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The command's exit code and its stdout and stderr together."""
    with pytest.raises(SystemExit) as info:
        main(args)
    captured = capsys.readouterr()
    code = info.value.code if isinstance(info.value.code, int) else 0
    return code, captured.out + captured.err


def _catalog_lines() -> list[str]:
    text = resources.files("placer.spec").joinpath("presets", "gpus.yaml").read_text("utf-8")
    return text.splitlines()


def _defined_tags(lines: list[str]) -> set[str]:
    """Tags the header defines: '#   [TAG] ...'."""
    return {m.group(1) for line in lines if (m := re.match(r"#\s+\[([A-Z0-9-]+)\]", line))}


def test_every_figure_line_cites_a_defined_source() -> None:
    lines = _catalog_lines()
    tags = _defined_tags(lines)
    assert {"AIC", "MLE", "ROCM", "TT", "ACH", "V100-DS", "NVSMI"} <= tags
    checked = 0
    for line in lines:
        m = re.match(r"  (\w+): (\S+)\s*(#.*)?$", line)
        if m is None or m.group(1) not in FIGURES or m.group(2) == "null":
            continue
        cited = set(re.findall(r"\[([A-Z0-9-]+)", m.group(3) or ""))
        assert cited, f"no source tag on: {line}"
        assert cited <= tags, f"undefined tag {cited - tags} on: {line}"
        checked += 1
    assert checked >= 4 * len(gpu_names()) - 10  # every part has its four to six figures


def test_sources_note_covers_each_added_part_and_tag() -> None:
    text = SOURCES.read_text(encoding="utf-8")
    section = text.split("### 5.4", 1)[1].split("\n## ", 1)[0]
    for name in ADDED:
        assert f"| {name}" in section, name
    for tag in ("AIC", "MLE", "ROCM", "TT", "ACH", "NVSMI", "V100-DS", "WAREDB", "GIGAGPU",
                "FA-ARCH"):
        assert f"| {tag} |" in section, tag
    # the part that could not be sourced is named as such, and is not in the catalog
    assert "H200 NVL" in section
    assert not {"H200-NVL", "H200NVL"} & set(gpu_names())


@pytest.mark.parametrize("name", ADDED)
def test_added_part_validates_and_loads_in_any_case(name: str) -> None:
    gpu = gpu_preset(name)
    assert GPU.model_validate(gpu.model_dump()) == gpu
    assert load_gpu(name.lower()) == gpu
    # dense peaks: FP8 is twice BF16 on every part that has it (no sparse figure slipped in)
    if gpu.fp8_flops is not None:
        assert gpu.fp8_flops == pytest.approx(2 * gpu.bf16_flops, rel=0.01)


def test_published_figures() -> None:
    """A few figures against the sources' own numbers (docs/sources.md 5.4)."""
    assert gpu_preset("H800").bf16_flops == gpu_preset("H100-SXM-80GB").bf16_flops
    assert gpu_preset("H20").bf16_flops == 148e12
    assert gpu_preset("L4").bf16_flops == 121e12  # NVIDIA's 242 is with sparsity
    assert gpu_preset("MI355X").fp8_flops == 5000e12  # AMD's 10.1 PFLOPS is with sparsity
    assert gpu_preset("MI300X").memory_bytes == 192 * 2**30
    assert gpu_preset("B300").memory_bytes == 275040 * 2**20
    assert gpu_preset("V100-SXM2-32GB").fp8_flops is None
    # Ada's tensor peaks with FP32 accumulation, what training GEMMs use (WAREDB, GIGAGPU); the
    # FP16-accumulate ones are twice these
    assert gpu_preset("RTX-4090").bf16_flops == 165.2e12
    assert gpu_preset("RTX-4090").fp8_flops == 330.3e12
    assert gpu_preset("RTX-4090").memory_bytes == 24564 * 2**20


# Maximum achievable matmul TFLOPS, BF16 and FP8 (None: no row), as stas00/ml-engineering@744d01e
# compute/accelerator/README.md prints them ("Maximum Achievable Matmul FLOPS comparison table");
# H800 and A800 are the H100 SXM and A100 SXM rows (same silicon, docs/sources.md 5.4).
MAMF_TFLOPS = {"B300": (1769.0, 3353.3), "MI300X": (668.4, None), "MI325X": (784.9, None),
               "MI355X": (1565.0, None), "H800": (794.5, 1402.6), "A800-80GB": (271.2, None)}


@pytest.mark.parametrize("name", sorted(MAMF_TFLOPS))
def test_gemm_ceiling_is_the_measured_matmul_rate(name: str) -> None:
    gpu = gpu_preset(name)
    gemm = gemm_for(gpu)
    bf16, fp8 = MAMF_TFLOPS[name]
    # the catalog's 989.4 against the table's 989 for H800/H100: 0.04 %
    assert gemm.max_efficiency * gpu.bf16_flops == pytest.approx(bf16 * 1e12, rel=5e-4)
    if fp8 is not None:
        assert gemm.fp8_max_efficiency * gpu.fp8_flops == pytest.approx(fp8 * 1e12, rel=5e-4)
    fp8_note = [n for n in ceiling_notes(gpu, "fp8") if "FP8" in n]
    assert bool(fp8_note) == (fp8 is None and gpu.fp8_flops is not None)
    assert not [n for n in ceiling_notes(gpu, "bf16") if "GEMM ceiling" in n]


def test_sm_counts_of_the_added_parts() -> None:
    """B300 148 (ml-engineering training/performance), H20 78 (an H20's device properties),
    AMD compute units from ROCm's GPU specifications; H800/A800 their silicon's."""
    expected = {"B300": 148, "H20": 78, "MI300X": 304, "MI325X": 304, "MI355X": 256,
                "H800": 132, "A800-80GB": 108, "RTX-4090": 128}
    assert {name: sm_count(gpu_preset(name)) for name in expected} == expected


def test_a_borrowed_ceiling_is_named_with_its_fraction() -> None:
    # H20 has no MAMF row: H100's FP8 one is 1402.6 / 1979 = 70.9 %, BF16 794.5 / 989 = 80.3 %
    h20 = gpu_preset("H20")
    assert gemm_for(h20).max_efficiency == pytest.approx(794.5 / 989, rel=1e-3)
    (bf16_note,) = [n for n in ceiling_notes(h20, "bf16") if "GEMM ceiling" in n]
    assert "H100's measured 80.3%" in bf16_note and "148 TFLOP/s BF16" in bf16_note
    assert "70.9%" in ceiling_notes(h20, "fp8")[0]
    v100 = " ".join(ceiling_notes(gpu_preset("V100-SXM2-32GB"), "bf16"))
    assert "SM count not sourced" in v100 and "FP16 peak" in v100
    assert "H100's" in " ".join(ceiling_notes(gpu_preset("MI300X"), "bf16"))  # kernel constants
    for name in ("H100-SXM-80GB", "H200-141GB", "B200", "A100-40GB", "H800"):
        assert ceiling_notes(gpu_preset(name), "fp8") == [], name


def test_amd_parts_use_rccl_and_v100_fp16() -> None:
    assert {n for n in gpu_names() if gpu_preset(n).collectives_library == "rccl"} == set(AMD)
    v100 = gpu_preset("V100-SXM2-32GB")
    assert v100.half_precision_dtype == "fp16"
    assert "FP16" in (v100.precision_note("bf16") or "")
    assert gpu_preset("H100-SXM-80GB").precision_note("bf16") is None
    assert "no FP8" in (gpu_preset("A800-80GB").precision_note("fp8") or "")


def test_launch_refuses_amd_clusters() -> None:
    for name in AMD:
        cluster, _ = resolve_gpu(cluster_preset("dgx-h100"), name)
        with pytest.raises(PlacerError, match="NVIDIA GPUs.*own launcher"):
            require_nccl_gpus(cluster)
    require_nccl_gpus(cluster_preset("dgx-h100"))


@pytest.mark.parametrize(("gpu", "cluster"), [
    ("H800", "dgx-h100"), ("A800-80GB", "dgx-a100"), ("H20", "hgx-h200"),
    ("L4", "pcie-8x-l40s"), ("B300", "dgx-b200"), ("GB300", "gb200-nvl72"),
    ("MI300X", "dgx-h100"), ("MI325X", "dgx-h100"), ("MI355X", "dgx-h100"),
    ("V100-SXM2-32GB", "dgx-a100"), ("RTX-4090", "pcie-8x-l40s"),
])
def test_recommend_runs_on_a_preset_cluster_of_each_added_part(
        gpu: str, cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run([
        "recommend-layout", "--model", "gpt-1.7b", "--cluster", cluster, "--gpu", gpu,
        "--nodes", "1", "--seq-len", "2048", "--global-batch", "64", "--no-what-if", "--top",
        "1", "--quiet"], capsys)
    assert code == 0, output
    assert f"GPUs: {gpu})" in output
    if gpu in AMD:
        assert "uses RCCL" in output  # the kept NVLink fabric is called out
    if gpu == "V100-SXM2-32GB":
        assert "FP16 mixed precision" in output
    borrowed = f"warning: {gpu}: no matmul measurement (MAMF)"
    assert (borrowed in output) == (gpu in ("H20", "L4", "GB300", "V100-SXM2-32GB", "RTX-4090")), \
        output


def test_emit_for_amd_fails_before_the_search(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run([
        "recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpu", "MI300X",
        "--nodes", "1", "--no-what-if", "--emit", str(tmp_path / "out")], capsys)
    assert code == 2
    assert "own launcher" in output
    assert "searching" not in output and "Top " not in output
    assert not (tmp_path / "out").exists()


def test_bad_script_fails_before_the_search(capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run([
        "recommend-layout", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
        "--no-what-if", "--script=-x"], capsys)
    assert code == 2
    assert "--script" in output and "Top " not in output


def test_presets_lists_each_part_with_its_library_and_16_bit_format(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, output = _run(["presets"], capsys)
    assert code == 0
    rows = {line.split("│")[1].strip(): line for line in output.splitlines()
            if line.startswith("│") and line.split("│")[1].strip() in gpu_names()}
    assert sorted(rows) == sorted(gpu_names())
    assert "125 (FP16)" in rows["V100-SXM2-32GB"]
    assert all("RCCL" in rows[name] for name in AMD)
    assert "NCCL" in rows["H800"] and "RCCL" not in rows["H800"]


def test_mxfp8_tensor_cores_are_blackwells_and_amd_is_unknown() -> None:
    # Transformer Engine's MXFP8 runs on SM 10.0 (B200, GB200) and 10.3 (B300, GB300) only.
    flags = {name: gpu_preset(name).mxfp8_tensor_cores for name in gpu_names()}
    assert {name for name, flag in flags.items() if flag} == {"B200", "GB200", "B300", "GB300"}
    assert {name for name, flag in flags.items() if flag is None} == set(AMD)


def _mxfp8_job(tmp_path: Path) -> str:
    job = tmp_path / "job.yaml"
    job.write_text("seq_len: 8192\nglobal_batch_size: 64\nprecision: fp8\n"
                   "stack: megatron-core@0.20\nruntime: {fp8_recipe: mxfp8}\n")
    return str(job)


def test_an_mxfp8_job_on_hopper_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = ["--layout", "tp=1,pp=1,dp=8,mbs=1,zero=1"]
    args = ["estimate", "--model", "llama3-8b", "--nodes", "1", "--job", _mxfp8_job(tmp_path)]
    code, text = _run([*args, "--cluster", "dgx-h100", *layout], capsys)
    assert code == 2
    assert text.strip().splitlines() == [
        "error: runtime.fp8_recipe: 'mxfp8' is not valid; H100-SXM-80GB has no MXFP8 tensor "
        "cores (MXFP8 needs Blackwell, SM 10.0 or 10.3: Transformer Engine's mxfp8 recipe, "
        "torchtitan's MXFP8 converter): use a per-tensor, rowwise or blockwise recipe"]
    code, text = _run([*args, "--cluster", "dgx-b200", *layout], capsys)
    assert code == 0 and "MXFP8" not in text
    # unknown to placer's sources: warned, not refused
    code, text = _run([*args, "--cluster", "dgx-b200", "--gpu", "MI355X", *layout], capsys)
    assert code == 0
    assert "warning: MI355X: not known to have MXFP8 tensor cores" in text
