"""The cost model: pure functions of (model, cluster, job, layout, placement) -> typed results.

``estimate`` returns an ``Estimate`` (step time, throughput, MFU, memory, breakdown, the
collectives each dimension issues); ``memory_estimate`` is the cheap, topology-free memory check
used for pruning; ``minimum_gpus_needed`` is the tightest lower bound on GPUs for a model.
``CostOptions`` says how the framework runs a layout (fused attention, overlaps, MoE imbalance);
a ``LinkProfile`` (placer.spec.profile) replaces the preset link and GEMM constants.

Modules: params (parameter counts, stage split), memory, compute (FLOPs and GEMM time),
collectives (one NCCL call over one group), groups (representative groups and their links),
step (composition and overlaps), profile (hardware constants, fitted by bench/fit_compute.py).
"""

from placer.cost.memory import MinimumGpus, memory_estimate, minimum_gpus_needed
from placer.cost.options import DEFAULT_OPTIONS, CostOptions
from placer.cost.params import total_params
from placer.cost.profile import Calibration, calibration_for
from placer.cost.step import estimate, estimate_with

__all__ = [
    "DEFAULT_OPTIONS", "Calibration", "CostOptions", "MinimumGpus", "calibration_for",
    "estimate", "estimate_with", "memory_estimate", "minimum_gpus_needed", "total_params",
]
