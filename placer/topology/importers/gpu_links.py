"""Link facts of each catalog GPU that topology files do not state: NVLink generation, links per
GPU and rate per link, PCIe generation, and the compute capability (``sm``) NCCL XML reports."""

from __future__ import annotations

from dataclasses import dataclass

from placer.errors import PlacerError


@dataclass(frozen=True)
class GpuLinks:
    sm: int
    nvlink_generation: int | None
    nvlink_links: int
    """NVLinks per GPU (0 when the GPU has none)."""
    nvlink_link_bytes_per_s: float
    """One NVLink, one direction."""
    pcie_bytes_per_s: float
    """The GPU's x16 PCIe link, one direction."""


# docs/sources.md 5.1: NVLink3 (A100) is 12 links, 600 GB/s per GPU both directions; NVLink4
# (H100/H200) is 18 links, 900 GB/s; NVLink5 (B200) is 18 links, 1.8 TB/s. Per link per direction:
# 600e9 / 12 / 2 = 25 GB/s, 900e9 / 18 / 2 = 25 GB/s, 1.8e12 / 18 / 2 = 50 GB/s.
NVLINK3 = (3, 12, 600e9 / 12 / 2)
NVLINK4 = (4, 18, 900e9 / 18 / 2)
NVLINK5 = (5, 18, 1.8e12 / 18 / 2)
NO_NVLINK = (None, 0, 0.0)
# docs/sources.md 5.4: A800 and H800 keep 8 of their NVLinks (NV8 in nvidia-smi topo -m; 400 GB/s
# both directions, 200 GB/s each way = 8 x 25 GB/s); V100's NVLink2 is 6 links of 25 GB/s each way.
NVLINK3_8 = (3, 8, 600e9 / 12 / 2)
NVLINK4_8 = (4, 8, 900e9 / 18 / 2)
NVLINK2 = (2, 6, 150e9 / 6)
# docs/sources.md 5.1: PCIe Gen4 x16 32 GB/s per direction (A100), Gen5 x16 64 GB/s (H100).
PCIE_GEN4_X16_BYTES_PER_S = 32e9
PCIE_GEN5_X16_BYTES_PER_S = 64e9
# [derived] Gen3 is half of Gen4 (V100); Gen6 twice Gen5 (B300: 128 GB/s each way, docs/sources.md
# 5.4, NVIDIA aiconfigurator b300_sxm.yaml).
PCIE_GEN3_X16_BYTES_PER_S = 16e9
PCIE_GEN6_X16_BYTES_PER_S = 128e9
# x16 rate per direction by signalling rate in NCCL XML's link_speed ("16.0 GT/s PCIe"): Gen4 and
# Gen5 from docs/sources.md 5.1; Gen3 (8 GT/s) half of Gen4 and Gen6 (64 GT/s) twice Gen5 [derived].
PCIE_X16_BYTES_PER_S_BY_GTS = {8.0: 16e9, 16.0: 32e9, 32.0: 64e9, 64.0: 128e9}

GPU_LINKS: dict[str, GpuLinks] = {
    "A100-40GB": GpuLinks(80, *NVLINK3, PCIE_GEN4_X16_BYTES_PER_S),
    "A100-80GB": GpuLinks(80, *NVLINK3, PCIE_GEN4_X16_BYTES_PER_S),
    "H100-SXM-80GB": GpuLinks(90, *NVLINK4, PCIE_GEN5_X16_BYTES_PER_S),
    "H200-141GB": GpuLinks(90, *NVLINK4, PCIE_GEN5_X16_BYTES_PER_S),
    # Gen5 as in presets/clusters/dgx-b200.yaml and gb200-nvl72.yaml.
    "B200": GpuLinks(100, *NVLINK5, PCIE_GEN5_X16_BYTES_PER_S),
    "GB200": GpuLinks(100, *NVLINK5, PCIE_GEN5_X16_BYTES_PER_S),
    # L40S datasheet (gpus.yaml [L40S-DS]): PCIe Gen4 x16, no NVLink; Ada is compute capability 8.9.
    "L40S": GpuLinks(89, *NO_NVLINK, PCIE_GEN4_X16_BYTES_PER_S),
    # docs/sources.md 5.4 (sm from NVIDIA aiconfigurator's system files; AMD parts have none and
    # are not read from NVIDIA topology files: gpu_links refuses them).
    "H800": GpuLinks(90, *NVLINK4_8, PCIE_GEN5_X16_BYTES_PER_S),
    "A800-80GB": GpuLinks(80, *NVLINK3_8, PCIE_GEN4_X16_BYTES_PER_S),
    "H20": GpuLinks(90, *NVLINK4, PCIE_GEN5_X16_BYTES_PER_S),
    "L4": GpuLinks(89, *NO_NVLINK, PCIE_GEN4_X16_BYTES_PER_S),
    # GeForce RTX 4090: no NVLink, PCIe Gen4 x16, sm_89 (docs/sources.md 5.4, FA-ARCH).
    "RTX-4090": GpuLinks(89, *NO_NVLINK, PCIE_GEN4_X16_BYTES_PER_S),
    "B300": GpuLinks(103, *NVLINK5, PCIE_GEN6_X16_BYTES_PER_S),
    "GB300": GpuLinks(103, *NVLINK5, PCIE_GEN5_X16_BYTES_PER_S),
    "V100-SXM2-32GB": GpuLinks(70, *NVLINK2, PCIE_GEN3_X16_BYTES_PER_S),
}

# docs/sources.md 8.3: sm is 80 (A100), 90 (H100/H200), 100 (B200). Memory size is not in the file,
# so the catalog GPU with the larger memory is the guess; GB200 when the GPU has a C2C link.
GPU_BY_SM = {80: "A100-80GB", 90: "H100-SXM-80GB", 100: "B200"}
GRACE_GPU_BY_SM = {100: "GB200"}


def gpu_links(name: str) -> GpuLinks:
    from placer.spec.presets import gpu_preset

    if name not in GPU_LINKS and gpu_preset(name).collectives_library == "rccl":
        raise PlacerError(
            f"--gpu: {name} is an AMD GPU; topology import reads NVIDIA's nvidia-smi topo -m and "
            "NCCL XML, not ROCm's: describe the node in a cluster file (placer init cluster)")
    if name not in GPU_LINKS:
        raise PlacerError(
            f"--gpu: {name!r} has no link data for topology import; use one of "
            f"{', '.join(GPU_LINKS)}"
        )
    return GPU_LINKS[name]
