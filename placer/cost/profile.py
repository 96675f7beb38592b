"""Hardware constants of the cost model, and how a measured link profile replaces them.

Two kinds of constant live here, each with its source:

* link efficiencies: the fraction of a link's line rate that NCCL reaches as bus bandwidth for
  large messages, from nccl-tests results (docs/sources.md section 4);
* compute efficiencies per GPU family: the achievable fraction of the dense peak for large GEMMs
  and fused attention, the GEMM size that reaches half of it, and the memory traffic of the
  element-wise kernels. These are fitted by ``bench/fit_compute.py`` over every calibration row
  of a GPU family at once (never per row); rerun that script to refit them.

``calibration_for(cluster, profile)`` resolves them for one cluster; a ``LinkProfile`` (written
by the calibrate command from real measurements) replaces the preset figures it names.
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.cost.memo import new_cache, register_constants, remember
from placer.spec.cluster import Cluster, NodeType
from placer.spec.gpu import GPU
from placer.spec.profile import GemmProfile, LinkMeasurement, LinkProfile

# --- Link efficiencies (bus bandwidth / line rate, large messages) -------------------------------
# NVLink3 (A100): 232.5 GB/s all_reduce busbw on one 8-GPU node of 300 GB/s per direction
# [docs/sources.md 4: nccl-tests#175].
NVLINK3_EFFICIENCY = 232.5 / 300.0
# NVLink4/5 (H100, H200, B200): ~365-370 GB/s ring busbw of 450 GB/s line rate
# [docs/sources.md 4: nccl-tests#212, nccl#1455]; NVLink5 assumed to behave like NVLink4.
NVLINK4_EFFICIENCY = 367.5 / 450.0
# NVLink SHARP all_reduce: ~480 GB/s busbw on H100 with 450 GB/s links, i.e. above line rate
# [docs/sources.md 4: nccl-tests#212, nccl-tests#290].
NVLS_ALL_REDUCE_SPEEDUP = 480.0 / 450.0
# PCIe: NCCL's own model counts 12 GB/s for a Gen3 x16 link of 16 GB/s [docs/sources.md 5.1:
# src/graph/topo.h PCI_BW]; no nccl-tests figure was found.
PCIE_EFFICIENCY = 12.0 / 16.0
# InfiniBand NDR: 46-48 GB/s per 50 GB/s NIC [docs/sources.md 4: nccl-tests#290, #267]; HDR
# A100 nodes reach 192 GB/s over 8 x 25 GB/s (0.96) [nccl#812]; we use the NDR figure.
NETWORK_EFFICIENCY = 47.0 / 50.0

# --- Compute efficiencies per GPU family, fitted by bench/fit_compute.py -------------------------
# max_efficiency / fp8_max_efficiency: large GEMMs, fraction of the dense peak: the GPU's MAMF
#   microbenchmark (MAMF_EFFICIENCY below; gemm_for puts each GPU's own there), not fitted.
# half_efficiency_flops: a GEMM of this many FLOPs at the ceiling rate lasts as long as the fixed
#   time per GEMM kernel that compute.gemm_times adds to every GEMM. Fitted to training steps it
#   is ~56 us (H100), ~37 us (B200), ~36 us (A100), 6-12x a lone kernel's measured 5-6 us
#   (tests/test_gemm_microbenchmark.py, docs/sources.md 12): it also carries per-kernel costs
#   of a step that are not priced kernel by kernel (most of all the MoE rows' per-expert GEMMs).
# attention_efficiency: fused attention kernels, fraction of the BF16 peak.
# Fused attention before Hopper is FlashAttention-2 (FlashAttention-3 needs Hopper's TMA and
# warpgroup MMA), so a family here takes its attention_efficiency from the reference family's
# fitted one times the ratio of the two kernels' published peak fractions, not from a fit of its
# own: FA2 reaches "50-73% of the theoretical maximum FLOPs/s on A100" (Dao 2023,
# arXiv:2307.08691, abstract), the Hopper kernels H100's figure describes up to 75 % of H100's
# ("740 TFLOPs/s (75% utilization)", FlashAttention-3, Shah et al. 2024, arXiv:2407.08608,
# abstract); both are forward-pass maxima over the same benchmark (docs/sources.md 12). Only
# llm-foundry's rows run fused attention on A100, so a fit of A100's own would rest on one source.
ATTENTION_RELATIVE_TO: dict[str, tuple[str, float]] = {"A100": ("H100", 0.73 / 0.75)}


def related_attention(family: str, efficiencies: dict[str, float]) -> float | None:
    """``family``'s fused-attention efficiency from its reference family's (ATTENTION_RELATIVE_TO),
    given the reference's in ``efficiencies`` (family -> attention_efficiency); None: unrelated."""
    reference, ratio = ATTENTION_RELATIVE_TO.get(family, ("", 0.0))
    value = efficiencies.get(reference)
    return None if value is None else value * ratio


def _related(table: dict[str, GemmProfile]) -> dict[str, GemmProfile]:
    efficiencies = {f: g.attention_efficiency for f, g in table.items()
                    if g.attention_efficiency is not None}
    out = dict(table)
    for family in ATTENTION_RELATIVE_TO:
        value = related_attention(family, efficiencies)
        if family in out and value is not None:
            out[family] = out[family].model_copy(update={"attention_efficiency": value})
    return out


GEMM_BY_FAMILY: dict[str, GemmProfile] = _related({
    # B200 holds GB200's rows too (CONSTANT_FAMILY); H100 holds H200's. attention_efficiency is
    # cuDNN's / FlashAttention-3's on Hopper and later (compute.FA2_RELATIVE_THROUGHPUT), and
    # FlashAttention-2's on A100 (H100's times ATTENTION_RELATIVE_TO's ratio).
    "A100": GemmProfile(max_efficiency=271.2 / 312, half_efficiency_flops=8.20e+09),
    "H100": GemmProfile(max_efficiency=794.5 / 989, half_efficiency_flops=3.71e+10,
                        attention_efficiency=0.385),
    "B200": GemmProfile(max_efficiency=1745.0 / 2250, half_efficiency_flops=5.39e+10,
                        attention_efficiency=0.313),
})
# Maximum achievable matmul FLOPS (MAMF) per GPU, as a fraction of the dense peak: the best mean
# of 100 timed iterations over a brute-force search of BF16 / FP8 (e4m3) matmul shapes,
# stas00/ml-engineering@744d01e compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
# comparison table" (docs/sources.md 12). A microbenchmark, not a fit to training runs: the
# cost model's large-GEMM ceiling (``max_efficiency`` / ``fp8_max_efficiency``). H200's BF16 is
# H100's (the table's note: "H200 is the same"); A100 has no FP8 (None: BF16's is used).
MAMF_EFFICIENCY: dict[str, tuple[float, float | None]] = {
    "A100": (271.2 / 312, None),
    "H100": (794.5 / 989, 1402.6 / 1979),
    "H200": (794.5 / 989, 1453.4 / 1979),
    "B200": (1745.0 / 2250, 3432.5 / 4500),
    "GB200": (1822.0 / 2500, 3615.6 / 5000),
    # Added for issue 20, from the same table: the measured TFLOPS over the catalogue's dense
    # peak, so that the ceiling is the measured rate (the table's "Theory" column says 1300 for
    # MI300X/MI325X where the catalogue has 1307.4, and 2300 for MI355X, which is MI350X's
    # figure, where AMD's MI355X page gives 2500: docs/sources.md 5.4). The table has no FP8
    # measurement of an AMD part (None: ceiling_notes says BF16's fraction is used).
    "B300": (1769.0 / 2250, 3353.3 / 4500),
    "MI300X": (668.4 / 1307.4, None),
    "MI325X": (784.9 / 1307.4, None),
    "MI355X": (1565.0 / 2500, None),
}
# Streaming multiprocessors, the slots of GEMM wave quantization (compute.wave_efficiency):
# 108 on A100, 132 on H100/H200, 148 on a B200 SKU (stas00/ml-engineering@744d01e
# training/performance/README.md, "Tile and wave quantization" and "Do more SMs give more
# TFLOPS?"); GB200's GPUs are B200 dies (148 taken); L40S 142 (AD102 as shipped in L40S,
# NVIDIA L40S datasheet) [docs/sources.md 12]. Other GPUs take H100's count.
SM_COUNT = {"A100": 108, "H100": 132, "H200": 132, "B200": 148, "GB200": 148, "L40S": 142,
            # issue 20: B300 148 (the SKU of the MAMF row; a 152-SM one exists, same README);
            # H20 78 (torch.cuda.get_device_properties of an H20, alipay/
            # PainlessInferenceAcceleration@78c9b00 flood/flood/ops/seg_mla.py); compute units,
            # AMD's scheduling slots: MI300X/MI325X 304, MI355X 256 (ROCm "AMD GPU
            # specifications") [docs/sources.md 5.4]. H800 and A800 are H100 and A100 silicon
            # (CONSTANT_FAMILY) and take those counts.
            # RTX 4090 128 (Dao-AILab/flash-attention@7cf4858 autotuner/arch/RTX4090.py).
            "B300": 148, "H20": 78, "MI300X": 304, "MI325X": 304, "MI355X": 256, "RTX-4090": 128}
DEFAULT_SM_COUNT = 132
# Parts that are a measured part's silicon with only NVLink cut: that part's MAMF measurement and
# SM count are theirs [docs/sources.md 5.4: AIC h800_sxm "identical to H100 SXM"; ACH, aiwiki:
# the A800 keeps A100's compute, memory and Tensor Cores].
SAME_SILICON = {"H800": "H100", "A800": "A100"}
# Fraction of the microbenchmark's matmul rate that GEMMs inside a training step sustain: the
# same GPU runs every rank's kernels at once for minutes, at the power limit, with communication
# kernels occupying SMs beside it. One constant for every GPU (a mechanism, not a family), fitted
# by bench/fit_compute.py over all sources jointly.
GEMM_SUSTAINED_FRACTION = 0.837
# Dense FP4 tensor-core peak over the dense FP8 one on GPUs with FP4 tensor cores (Blackwell's
# fifth-generation tensor cores run NVFP4/MXFP4 GEMMs): B200 (HGX, 1000 W) 9000 vs 4500 TFLOP/s,
# GB200 (1200 W) 10000 vs 5000, NVIDIA's figures as tabulated on
# glennklockwood.com/garden/processors/B200 (docs/sources.md 5.3). No MAMF measurement of FP4
# exists in the MAMF table, so FP4 GEMMs sustain FP8's fraction of their peak (Calibration).
FP4_OVER_FP8_PEAK = {"B200": 2.0, "GB200": 2.0}
# Time of an MXFP8 GEMM (E4M3 with one E8M0 scale per 32 elements, block-scaled tensor-core MMA)
# over a per-tensor-scaled FP8 GEMM of the same shape, both with inputs already quantised:
# Transformer Engine's GEMM benchmark on a B300 (NVIDIA/TransformerEngine@8f2e635
# docs/examples/gemm_profiling/gemm_profiling.rst, "Autocast vs Pre-quantized", a 4096-hidden,
# 16384-FFN layer at 15,872 tokens, ``--pre-quantize``): 7.161 ms per layer's 12 GEMMs against
# FP8 current scaling's 6.812 (fprop 2.365 / 2.158, dgrad 2.397 / 2.329, wgrad 2.400 / 2.325).
# Kernel time only, as the MAMF ceilings it scales are (per-tensor-scaled torch._scaled_mm on
# quantised inputs): placer prices no recipe's quantisation passes, which the fitted
# GEMM_SUSTAINED_FRACTION carries for every recipe alike. B300 keeps B200's dense FP8 peak, so
# the ratio is taken for the Blackwell family, the only GPUs with MXFP8 tensor cores.
MXFP8_GEMM_TIME_RATIO = 7.161 / 6.812
# Precisions whose GEMMs run on the low-precision tensor cores: "fp8" (a job's FP8 recipe),
# "mxfp8" (its linear layers under MXFP8 block scaling, CostOptions.mxfp8_gemms) and "fp4" (its
# linear layers in NVFP4, CostOptions.fp4_gemms).
LOW_PRECISIONS = ("fp8", "mxfp8", "fp4")
# Die families with Hopper's tensor-memory accelerator and warpgroup MMA, which FlashAttention-3
# and cuDNN's fused attention use and FlashAttention-2 does not (compute.FA2_RELATIVE_THROUGHPUT).
HOPPER_CLASS_FAMILIES = frozenset({"H100", "B200"})
# GPUs built on one die share their efficiency constants; their peaks and HBM bandwidth come from
# the GPU catalogue. H200 is H100's GH100 die with more and faster HBM [docs/sources.md 5.3];
# GB200's GPUs are B200 dies in a Grace-Blackwell superchip at a higher power limit.
CONSTANT_FAMILY = {"H200": "H100", "GB200": "B200",
                   # issue 20 [docs/sources.md 5.4]: H800 is H100 SXM with NVLink cut ("identical
                   # to H100 SXM", AIC), A800 is A100 silicon with NVLink cut (ACH, aiwiki); H20
                   # is Hopper (sm_90), B300/GB300 Blackwell (sm_103) and L4 Ada (sm_89) in
                   # AIC's system files: their kernel constants are their architecture's.
                   "H800": "H100", "A800": "A100", "H20": "H100", "B300": "B200",
                   "GB300": "B200", "L4": "L40S",
                   # the GeForce RTX 4090 is AD102, L40S's die, at sm_89 (FA-ARCH)
                   "RTX-4090": "L40S"}
# Families without fitted constants borrow the nearest measured one (an assumption, to be
# replaced by a measured profile): Blackwell takes Hopper's, Ada Ampere's.
FAMILY_FALLBACK = {"B200": "H100", "L40S": "A100"}
# Bytes of element-wise memory traffic (norms, activations, residuals, dropout, casts) per byte
# of stored activation in the forward pass; backward moves twice that. Fitted by
# bench/fit_compute.py jointly over all GPU families (HBM bandwidth scales it per GPU).
ELEMENTWISE_TRAFFIC_FACTOR = 2.40
# Fraction of communication that overlapping with compute actually hides: collectives and
# compute share SMs and memory bandwidth, so overlapped traffic still costs (1 - this) of its
# time. One figure per overlap mechanism, each fitted by bench/fit_compute.py jointly over all
# rows (only rows that use a mechanism move its figure): OVERLAP_EFFICIENCY for the bucketed
# data-parallel gradient reduction and parameter gather, the CP ring's K/V exchange and the MoE
# all-to-all behind the other micro-batch; TP_OVERLAP_EFFICIENCY for TP collectives pipelined
# chunk by chunk with their GEMMs (Megatron --tp-comm-overlap userbuffers, torchtitan async TP:
# the MCORE_R080_README and TORCHTITAN_2412 rows); ZERO_OVERLAP_EFFICIENCY for ZeRO-2/3 gathers
# and reduce-scatters per micro-batch (FSDP, DeepSpeed ZeRO-3: LLMFOUNDRY_MPT, NARAYANAN21,
# torchtitan, Llama 3 paper and NeMo AutoModel rows). All three, like every fitted constant in
# this file, are the in-sample fold of bench/accuracy.py --loso-jobs 2 --loso-rounds 3
# --loso-cycles 6, last run 2026-12-02 13:51-14:05 UTC on the cost model and data of 682bc3c
# (bench/results/accuracy-2026-12-02-stop20.txt).
OVERLAP_EFFICIENCY = 0.482
TP_OVERLAP_EFFICIENCY = 0.9
ZERO_OVERLAP_EFFICIENCY = 0.549
# Time the MoE token dispatcher spends per routed token copy, per pass (forward or backward),
# beyond the HBM passes compute.py counts. Fitted by bench/fit_compute.py over the calibration
# set's MoE rows (two Megatron-Bridge publications on H100, B200 and GB200: Qwen3-30B-A3B and
# 235B-A22B, GPT-OSS-120B, DeepSeek-V3; NeMo AutoModel with DeepEP on H100; FP8 and BF16,
# micro-batches of 1-4 sequences), jointly with the per-layer time
# below, which takes the part that does not grow with the micro-batch. Their shortfall
# against the rest of the model is proportional to the routed copies, not to the hidden size,
# so it is charged per copy: the routing map's index work (nonzero, sorts, probability gathers,
# chunk sorting by local expert) and the many small kernels of a fine-grained MoE layer that the
# Megatron-Core MoE report calls its compute wall (arXiv:2603.07685, section 1). One time for
# every GPU (host- and launch-bound work). Faster dispatchers (DeepEP, fused permutes) pay less: a
# measured profile's ``moe_dispatch_s_per_routed_token`` replaces it. Since the Megatron-Bridge
# MoE rows read their release's dispatcher (flex / HybridEP where its configs set it) and DeepEP's
# RDMA traffic is counted per node, and the 25.11/26.02.01 rows read their releases' configs
# (880936c, a21be44), the joint fit (2026-12-01 23:33) puts this time, and the per-layer one
# below, at 0: the routed copies' HBM passes and the all-to-all explain the MoE rows.
MOE_DISPATCH_S_PER_ROUTED_TOKEN = 0.0
# Fixed time of one MoE layer's token dispatch per pass, whatever the micro-batch: Megatron-Core's
# all-to-all dispatcher copies the per-expert token counts to the host to size its buffers (a
# device-to-host sync per layer, moe/token_dispatcher.py; the reason for its
# --moe-pad-expert-input-to-capacity option) and launches a train of small kernels. Fitted by
# bench/fit_compute.py jointly with the per-copy time over the MoE rows, whose micro-batches
# range from 1 to 4 sequences. The stop-18 refit put it at 6.7 us, the stop-20 refit (after the
# Llama-4-Scout rows' local batch was corrected to 1) at 16 us: a few of the small kernels'
# launch times; earlier fits put it at 0.
MOE_DISPATCH_S_PER_LAYER = 1.58e-05
# Host (CPU) time to launch one MoE layer's kernels in the forward pass: a part per layer (router,
# permutations, dispatcher) and a part per local expert (Transformer Engine's GroupedLinear issues a
# cuBLAS GEMM, and under FP8 a quantize kernel, per expert for each of the two linears). The
# dispatcher copies the per-expert token counts to the host each layer (Megatron-Core 0.16.1
# moe/experts.py TEGroupedMLP.forward: ``tokens_per_expert.tolist()``), so the host cannot run
# ahead of the GPU across MoE layers: a layer takes the longer of its GPU time and this launch
# time, and small micro-batches with many local experts are host-bound (Megatron-Bridge's
# Qwen3-30B-A3B on 8 B200, EP 8: 9.3-9.7k tokens/s/GPU at micro-batch 1 against 26.7-27.1k at 4).
# The backward launches twice the forward's GEMMs (data and weight gradients): twice this.
# Full-iteration CUDA graphs replay the launches without the host (CostOptions.cuda_graphs).
# One time for every GPU (host-bound work), fitted by bench/fit_compute.py over the MoE rows. The
# joint fit of 2026-12-01 put both at 0, but its search never tried a time that binds (its first
# steps from 0 stayed under every row's GPU time; fit_compute.STEP_FLOOR, stop 21). Fitted with the
# reaching floors and every other constant at its committed value (stop 21, 2026-12-02): 169 us per
# local expert, 0 per layer. It binds only on the rows with the least GPU time per expert: Bridge's
# Qwen3-30B-A3B on 8 B200 at micro-batch 1 (25.11, 26.02: +30 / +25 % -> +2 / -2 %), whose next
# release took micro-batch 4 and wider CUDA-graph scopes (Megatron-Bridge@0ec1df7, #2499: 2.75x);
# Bridge's MoE guide lists "Reduce kernel launches: ... increase MBS" and CUDA graphs as the fixes
# for CPU overhead (docs/training/moe-optimization.md, Phase 3), and Transformer Engine names the
# per-expert host work of GroupedLinear (NVIDIA/TransformerEngine#1499: torch.split and 2 x
# num_gemms torch.empty calls per call). The per-layer part stays 0: rows with few local experts
# (GB200 Qwen3-235B at EP 32, 4 experts, 2-3 ms forward) are not host-bound.
MOE_HOST_S_PER_LAYER = 0.0
MOE_HOST_S_PER_EXPERT = 1.69e-04
# Keys per query at which a fused-attention kernel reaches half its peak throughput (the
# saturation length of compute.attention_key_efficiency). Fitted by bench/fit_compute.py jointly
# over all rows (the NeMo long-sequence sweep spans 2K to 32K keys per kernel call).
ATTENTION_HALF_KEYS = 122
# FlashAttention in Triton (MPT's ``attn_impl: triton``, llm-foundry's flash_attn_triton.py on the
# pre-MLIR Triton) over FlashAttention-2's throughput on the same GPU, forward and backward alike
# (compute.attention_forward_s, CostOptions.attention_kernel "fa_triton"). Fitted by
# bench/fit_compute.py where rows run the kernel (137 of llm-foundry's 149 benchmark rows); where
# none does, FlashAttention-2's rate (its start, 1.0), so a leave-one-source-out fold without
# them learns nothing of them. With every other constant at its committed value the fit is 0.96
# (in-sample 6.94 -> 6.89 %, stop 27); the joint refit of the leave-one-source-out run puts it at
# 0.85. The FlashAttention-2 paper's A100 figures for "FlashAttention in Triton" (1.3-1.5x slower
# forward, 2x slower backward: Dao 2023, arXiv:2307.08691, section 4.1) are not what those rows
# measure: priced at them the refit's in-sample mean is 7.6 % (docs/sources.md 12).
TRITON_FA_RELATIVE = 0.96
# Achievable fraction of HBM bandwidth for streaming kernels (the optimizer step). STREAM-like
# copies reach ~85-90 % of the HBM spec on A100/H100 [unverified; no primary source found].
HBM_EFFICIENCY = 0.85


def gpu_family(gpu: GPU) -> str:
    """GPU family key: the catalogue name's leading part (``H100-SXM-80GB`` -> ``H100``)."""
    for family in ("GB200", "B200", "H200", "H100", "A100", "L40S", "RTX-4090"):
        if gpu.name.upper().startswith(family):
            return family
    return gpu.name.split("-")[0].upper()


def constant_family(gpu: GPU) -> str:
    """The family whose fitted constants a GPU uses: its die's (``GB200`` -> ``B200``)."""
    family = gpu_family(gpu)
    return CONSTANT_FAMILY.get(family, family)


def _measured_family(gpu: GPU) -> str:
    """The family whose measurements (MAMF, SM count) are this GPU's own: its silicon's."""
    family = gpu_family(gpu)
    return SAME_SILICON.get(family, family)


def _fitted_family(gpu: GPU) -> str:
    """The family whose fitted kernel constants a GPU uses (GEMM_BY_FAMILY's key)."""
    family = constant_family(gpu)
    return family if family in GEMM_BY_FAMILY else FAMILY_FALLBACK.get(family, "H100")


def gemm_for(gpu: GPU) -> GemmProfile:
    """The compute efficiencies for a GPU: its die family's fitted ones (or the fallback
    family's), with the large-GEMM ceilings from the GPU's own MAMF measurement where one
    exists (MAMF_EFFICIENCY), else the fitted family's measured ceilings, which
    ``ceiling_notes`` then names."""
    fitted = _fitted_family(gpu)
    base = GEMM_BY_FAMILY[fitted]
    measured = MAMF_EFFICIENCY.get(_measured_family(gpu)) or MAMF_EFFICIENCY.get(fitted)
    if measured is None:
        return base
    bf16, fp8 = measured
    return base.model_copy(update={"max_efficiency": bf16, "fp8_max_efficiency": fp8 or bf16})


def fp4_peak_flops(gpu: GPU) -> float | None:
    """Dense FP4 tensor-core peak of a GPU with FP4 tensor cores (FP4_OVER_FP8_PEAK)."""
    ratio = FP4_OVER_FP8_PEAK.get(gpu_family(gpu))
    return gpu.fp8_flops * ratio if ratio is not None and gpu.fp8_flops else None


def sm_count(gpu: GPU) -> int:
    """Streaming multiprocessors of a GPU (SM_COUNT; H100's where not listed)."""
    return SM_COUNT.get(_measured_family(gpu), DEFAULT_SM_COUNT)


def ceiling_notes(gpu: GPU, precision: str) -> list[str]:
    """What the cost model takes from another part for ``gpu``, one line each: a GEMM ceiling
    without a matmul measurement of this GPU (MAMF_EFFICIENCY), an FP8 ceiling without an FP8
    one, an SM count without a source, kernel constants of a part of another architecture."""
    family, fitted = _measured_family(gpu), _fitted_family(gpu)
    gemm = gemm_for(gpu)
    fp8 = precision == "fp8" and gpu.fp8_flops is not None
    dtype = "FP8" if fp8 else gpu.half_precision_dtype.upper()
    fraction = (gemm.fp8_max_efficiency or gemm.max_efficiency) if fp8 else gemm.max_efficiency
    peak = f"{gpu.peak_flops(precision) / 1e12:,.0f} TFLOP/s {dtype} peak"
    notes = []
    if family not in MAMF_EFFICIENCY:
        notes.append(f"{gpu.name}: no matmul measurement (MAMF) in placer's sources: its GEMM "
                     f"ceiling is {fitted}'s measured {fraction:.1%} of the dense peak, applied "
                     f"to its own {peak}")
    elif fp8 and MAMF_EFFICIENCY[family][1] is None:
        notes.append(f"{gpu.name}: no FP8 matmul measurement in placer's sources: its FP8 GEMM "
                     f"ceiling is its BF16 one, {fraction:.1%} of the dense peak, applied to its "
                     f"{peak}")
    if family not in SM_COUNT:
        notes.append(f"{gpu.name}: SM count not sourced: wave quantization counts "
                     f"{DEFAULT_SM_COUNT} (H100's)")
    if constant_family(gpu) not in GEMM_BY_FAMILY and constant_family(gpu) not in FAMILY_FALLBACK:
        notes.append(f"{gpu.name}: no training run of its architecture in the fit: the fixed time "
                     f"per GEMM kernel and the attention efficiency are {fitted}'s")
    return notes


def _merge_gemm(base: GemmProfile, measured: GemmProfile | None) -> GemmProfile:
    if measured is None:
        return base
    given = measured.model_dump(exclude_none=True)
    return base.model_copy(update=given)


@dataclass(frozen=True)
class Calibration:
    """Everything the cost model needs about one cluster's hardware, resolved once."""

    gpu: GPU
    peak_bf16_flops: float
    peak_fp8_flops: float | None
    hbm_bytes_per_s: float
    gemm: GemmProfile
    intra_kind: str  # "nvlink" or "pcie": the class of the hop inside a node
    intra_efficiency: float
    nvls_speedup: float
    network_efficiency: float
    elementwise_traffic_factor: float
    overlap_efficiency: float
    profile: LinkProfile | None
    moe_dispatch_s_per_routed_token: float = MOE_DISPATCH_S_PER_ROUTED_TOKEN
    attention_half_keys: float = ATTENTION_HALF_KEYS
    moe_dispatch_s_per_layer: float = MOE_DISPATCH_S_PER_LAYER
    sm_count: int = DEFAULT_SM_COUNT
    gemm_sustained_fraction: float = GEMM_SUSTAINED_FRACTION
    peak_fp4_flops: float | None = None  # dense FP4 tensor-core peak (FP4_OVER_FP8_PEAK)
    moe_host_s_per_layer: float = MOE_HOST_S_PER_LAYER
    moe_host_s_per_expert: float = MOE_HOST_S_PER_EXPERT
    tp_overlap_efficiency: float = TP_OVERLAP_EFFICIENCY
    zero_overlap_efficiency: float = ZERO_OVERLAP_EFFICIENCY
    triton_fa_relative: float = TRITON_FA_RELATIVE

    def peak_flops(self, precision: str) -> float:
        """Dense peak of ``precision``: ``fp4`` (NVFP4 GEMMs) where the GPU has FP4 tensor
        cores, else FP8's; ``fp8`` where it has FP8, else BF16's."""
        if precision == "fp4" and self.peak_fp4_flops is not None:
            return self.peak_fp4_flops
        if precision in LOW_PRECISIONS and self.peak_fp8_flops is not None:
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def gemm_efficiency(self, precision: str) -> float:
        """Sustained fraction of ``precision``'s peak for large GEMMs. FP4 has no MAMF
        measurement: it takes FP8's fraction (an assumption). MXFP8's block-scaled GEMMs run
        MXFP8_GEMM_TIME_RATIO slower than the per-tensor-scaled FP8 ones MAMF measures."""
        if precision in LOW_PRECISIONS and self.peak_fp8_flops is not None:
            ceiling = self.gemm.fp8_max_efficiency or self.gemm.max_efficiency
            if precision == "mxfp8":
                ceiling /= MXFP8_GEMM_TIME_RATIO
        else:
            ceiling = self.gemm.max_efficiency
        return ceiling * self.gemm_sustained_fraction

    def half_efficiency_flops(self, precision: str) -> float:
        """FLOPs at which a GEMM of ``precision`` reaches half its efficiency.

        The fitted figure is for BF16; what it stands for is a fixed time per GEMM kernel
        (launch, prologue and tail: calibrate fits it as latency x rate), which an FP8 GEMM pays
        too, so at FP8's higher rate the same time covers proportionally more FLOPs.
        """
        half = self.gemm.half_efficiency_flops or 0.0
        if precision not in LOW_PRECISIONS or self.peak_fp8_flops is None:
            return half
        bf16_rate = self.peak_bf16_flops * self.gemm_efficiency("bf16")
        return half * self.peak_flops(precision) * self.gemm_efficiency(precision) / bf16_rate

    def measured(self, link: str, collective: str) -> LinkMeasurement | None:
        """The profile's figure for a link class (``intra`` or ``inter``) and collective."""
        if self.profile is None:
            return None
        section = self.profile.intra_node if link == "intra" else self.profile.inter_node
        return None if section is None else section.for_collective(collective)


def _dispatch_s(profile: LinkProfile | None) -> float:
    measured = profile.gemm.moe_dispatch_s_per_routed_token if profile and profile.gemm else None
    return MOE_DISPATCH_S_PER_ROUTED_TOKEN if measured is None else measured


def memory_terms(profile: LinkProfile | None) -> tuple[float, int]:
    """(activation scale, overhead bytes) a profile's measured memory terms give the memory
    model; without them (1, 0): the memory model's own counts (``MemoryProfile``)."""
    if profile is None or profile.memory is None:
        return 1.0, 0
    return profile.memory.activation_scale, profile.memory.overhead_bytes


def _used_node_types(cluster: Cluster) -> list[NodeType]:
    used = {p.node_type for p in cluster.pools}
    return [t for t in cluster.node_types if t.name in used]


def bounding_node_type(cluster: Cluster) -> NodeType:
    """The node type whose GPU memory bounds a job: the smallest (then the slowest)."""
    return min(_used_node_types(cluster),
               key=lambda t: (t.gpu.capacity_bytes, t.gpu.bf16_flops, t.name))


def slowest_node_type(cluster: Cluster) -> NodeType:
    """The node type that paces a synchronous step on a mixed cluster: the lowest BF16 peak."""
    return min(_used_node_types(cluster),
               key=lambda t: (t.gpu.bf16_flops, t.gpu.hbm_bandwidth_bytes_per_s, t.name))


_CALIBRATIONS: dict[tuple[int, int], tuple[Cluster, LinkProfile | None, Calibration]] = (
    new_cache())


def calibration_for(cluster: Cluster, profile: LinkProfile | None = None) -> Calibration:
    """Resolve constants for ``cluster``; a profile's measured figures take precedence.

    On a mixed cluster every rank is costed on the slowest GPU: a synchronous step waits for it.
    Resolved once per cluster and profile object (a search asks for every layout), and
    registered (memo.register_constants) so the cost model's caches may key on it.
    """
    slot = (id(cluster), id(profile))
    hit = _CALIBRATIONS.get(slot)
    if hit is not None and hit[0] is cluster and hit[1] is profile:
        return hit[2]
    calib = _resolve(cluster, profile)
    remember(_CALIBRATIONS, slot, (cluster, profile, calib))
    register_constants(calib)
    return calib


def _resolve(cluster: Cluster, profile: LinkProfile | None) -> Calibration:
    node_type = slowest_node_type(cluster)
    gpu = node_type.gpu
    fabric = node_type.fabric
    if fabric.kind == "pcie":
        intra_kind, intra_eff = "pcie", PCIE_EFFICIENCY
    else:
        generation = fabric.nvlink_generation or 4
        intra_kind = "nvlink"
        intra_eff = NVLINK3_EFFICIENCY if generation <= 3 else NVLINK4_EFFICIENCY
    return Calibration(
        gpu=gpu,
        peak_bf16_flops=gpu.bf16_flops,
        peak_fp8_flops=gpu.fp8_flops,
        hbm_bytes_per_s=gpu.hbm_bandwidth_bytes_per_s,
        gemm=_merge_gemm(gemm_for(gpu), profile.gemm if profile else None),
        intra_kind=intra_kind,
        intra_efficiency=intra_eff,
        nvls_speedup=NVLS_ALL_REDUCE_SPEEDUP,
        network_efficiency=NETWORK_EFFICIENCY,
        elementwise_traffic_factor=ELEMENTWISE_TRAFFIC_FACTOR,
        overlap_efficiency=OVERLAP_EFFICIENCY,
        profile=profile,
        moe_dispatch_s_per_routed_token=_dispatch_s(profile),
        sm_count=sm_count(gpu),
        peak_fp4_flops=fp4_peak_flops(gpu),
    )
