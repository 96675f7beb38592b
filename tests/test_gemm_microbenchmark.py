"""placer's GEMM shape model against measured BF16 matmul times of single GEMMs.

compute.gemm_times prices a GEMM from its shape: FLOPs at the GPU's MAMF rate over the useful
fraction of its tile waves (wave_efficiency), bounded below by its HBM bytes, plus a fixed time
per kernel. Two public microbenchmarks time lone GEMMs, where no training-step effect
(GEMM_SUSTAINED_FRACTION, communication sharing the SMs) applies:

* H100 SXM: XLA's measured default matmul table for sm_90 (tensorflow/tensorflow@372d578
  third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h, ``kDefaultMatmulPTable``,
  ``bf16xbf16->bf16`` FLOP/s of b=1 entries; 30 of its shapes, 256^3 to 4096^3, copied below).
* B200: cuBLAS BF16 in pyptx.dev/performance ("Blackwell GEMM (tcgen05, bf16)" table, cuBLAS
  column, PyTorch 2.8 / CUDA 12.8): 2048^3 1,006, 4096^3 1,532, 4096x8192x8192 1,652,
  8192x4096x8192 1,648, 8192^3 1,610 TFLOP/s.

With a fixed kernel time of 5 us (H100) or 6 us (B200) the shape model reproduces both tables
(root-mean-square log error 0.11 and under 0.06). The fitted per-GEMM time placer uses for
training steps (profile.GEMM_BY_FAMILY half_efficiency_flops: ~60 us on H100, ~37 us on B200)
is many times that (it misses the H100 table's small shapes several-fold): it carries per-kernel
costs of a training step other than the GEMM kernel's own (docs/sources.md 12).
"""

from __future__ import annotations

import math
from dataclasses import replace

from placer.cost.compute import gemm_times
from placer.cost.profile import Calibration, calibration_for
from placer.spec.presets import cluster_preset

# (M, N, K) -> measured BF16 TFLOP/s, XLA's sm_90 table (b=1), rounded to 0.1 TFLOP/s.
XLA_SM90_BF16_TFLOPS: dict[tuple[int, int, int], float] = {
    (256, 256, 256): 6.5, (512, 256, 256): 11.5, (256, 512, 256): 11.5,
    (1024, 256, 256): 22.0, (1024, 1024, 1024): 236.3, (2048, 2048, 2048): 632.0,
    (4096, 4096, 4096): 783.3, (1024, 2048, 1024): 373.3, (4096, 1024, 1024): 488.1,
    (1024, 4096, 4096): 738.5, (4096, 2048, 4096): 758.4, (2048, 1024, 2048): 523.3,
    (4096, 4096, 512): 543.1, (4096, 4096, 256): 392.2, (256, 4096, 4096): 412.0,
    (4096, 512, 4096): 650.0, (2048, 4096, 4096): 753.6, (512, 512, 512): 40.7,
    (4096, 256, 256): 82.2, (256, 256, 4096): 84.3, (1024, 1024, 4096): 470.1,
    (4096, 2048, 2048): 716.1, (2048, 2048, 4096): 738.0, (512, 4096, 4096): 644.1,
    (4096, 256, 4096): 376.2, (1024, 1024, 512): 145.6, (2048, 2048, 512): 345.5,
    (1024, 4096, 1024): 490.3, (4096, 4096, 1024): 677.4, (4096, 4096, 2048): 738.7,
}
# cuBLAS BF16 on B200, pyptx.dev/performance.
PYPTX_B200_CUBLAS_BF16_TFLOPS: dict[tuple[int, int, int], float] = {
    (2048, 2048, 2048): 1006.0, (4096, 4096, 4096): 1532.0, (4096, 8192, 8192): 1652.0,
    (8192, 4096, 8192): 1648.0, (8192, 8192, 8192): 1610.0,
}


def lone_gemm_calibration(cluster: str, fixed_s: float | None) -> Calibration:
    """The cluster's constants for one GEMM alone on the GPU (no sustained-fraction derating),
    with the fixed kernel time ``fixed_s`` (None: placer's fitted one)."""
    calib = replace(calibration_for(cluster_preset(cluster)), gemm_sustained_fraction=1.0)
    if fixed_s is None:
        return calib
    rate = calib.peak_bf16_flops * calib.gemm_efficiency("bf16")
    gemm = calib.gemm.model_copy(update={"half_efficiency_flops": fixed_s * rate})
    return replace(calib, gemm=gemm)


def rms_log_error(table: dict[tuple[int, int, int], float], calib: Calibration) -> float:
    """Root-mean-square of log(predicted / measured seconds) over the table's shapes."""
    errors = []
    for (m, n, k), tflops in table.items():
        flops = 2.0 * m * n * k
        (predicted,) = gemm_times(((flops, 1),), ((m, n, k),), calib, "bf16")
        errors.append(math.log(predicted / (flops / (tflops * 1e12))))
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def test_h100_shape_model_matches_xla_measured_table_at_5_us() -> None:
    calib = lone_gemm_calibration("dgx-h100", 5e-6)
    assert rms_log_error(XLA_SM90_BF16_TFLOPS, calib) < 0.12
    # The smallest shapes are all fixed time: 256^3 measures 5.2 us, 512x512x512 6.6 us.
    (tiny,) = gemm_times(((2.0 * 256**3, 1),), ((256, 256, 256),), calib, "bf16")
    assert 5e-6 <= tiny < 7e-6


def test_b200_shape_model_matches_cublas_table_at_6_us() -> None:
    calib = lone_gemm_calibration("dgx-b200", 6e-6)
    assert rms_log_error(PYPTX_B200_CUBLAS_BF16_TFLOPS, calib) < 0.06
