"""GPU description: memory, peak dense FLOP/s, HBM bandwidth, and the collectives library."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from placer.spec.base import MIN_BYTES_PER_S, MIN_FLOPS, Spec


class GPU(Spec):
    """One accelerator model. Peaks are dense (no sparsity), as MFU needs."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
    memory_bytes: int = Field(gt=0, le=10**14, description="HBM capacity in bytes")
    bf16_flops: float = Field(ge=MIN_FLOPS, le=1e17, description="dense BF16 peak, FLOP/s")
    fp8_flops: float | None = Field(
        default=None, ge=MIN_FLOPS, le=1e17,
        description="dense FP8 peak, FLOP/s; null if unsupported"
    )
    hbm_bandwidth_bytes_per_s: float = Field(ge=MIN_BYTES_PER_S, le=1e15)
    usable_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="memory a job can allocate when less than memory_bytes (e.g. DGX B200)",
    )
    collectives_library: Literal["nccl", "rccl"] = Field(
        default="nccl",
        description="nccl for NVIDIA GPUs; rccl for AMD Instinct GPUs (ROCm), whose launch "
        "environment placer does not write",
    )
    mxfp8_tensor_cores: bool | None = Field(
        default=None,
        description="block-scaled MXFP8 tensor-core GEMMs (Blackwell, SM 10.0 and 10.3), which "
        "Transformer Engine's mxfp8 recipe needs; null: not known, so a job that asks for it is "
        "warned, not refused",
    )
    half_precision_dtype: Literal["bf16", "fp16"] = Field(
        default="bf16",
        description="the 16-bit tensor-core format bf16_flops measures: fp16 on parts without "
        "BF16 (V100), where a bf16 job runs as FP16 mixed precision with loss scaling",
    )

    def peak_flops(self, precision: str) -> float:
        """Dense peak for the job's precision; FP8 falls back to BF16 where unsupported."""
        if precision == "fp8" and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops

    @property
    def capacity_bytes(self) -> int:
        return self.usable_memory_bytes or self.memory_bytes

    def fp8_recipe_problem(self, recipe: str | None) -> str | None:
        """Why this part cannot run FP8 ``recipe``, or None. Transformer Engine's MXFP8 recipe
        runs on SM 10.0 and 10.3 only (its docs/features/low_precision_training/mxfp8/mxfp8.rst,
        "Supported devices"): a part known to lack MXFP8 tensor cores refuses it."""
        if recipe == "mxfp8" and self.mxfp8_tensor_cores is False:
            return (f"{self.name} has no MXFP8 tensor cores (MXFP8 needs Blackwell, SM 10.0 or "
                    "10.3: Transformer Engine's mxfp8 recipe, torchtitan's MXFP8 converter): use "
                    "a per-tensor, rowwise or blockwise recipe")
        return None

    def fp8_recipe_note(self, recipe: str | None) -> str | None:
        """A warning when it is not known whether this part runs FP8 ``recipe``, or None."""
        if recipe == "mxfp8" and self.mxfp8_tensor_cores is None:
            return (f"{self.name}: not known to have MXFP8 tensor cores (gpu.mxfp8_tensor_cores "
                    "is unset); the estimate assumes it does (Transformer Engine's mxfp8 recipe "
                    "needs Blackwell, SM 10.0 or 10.3)")
        return None

    def precision_note(self, precision: str) -> str | None:
        """What runs instead of the job's precision on this part, or None when it runs as asked.

        FP16 and BF16 are both 2 bytes per value, so memory and traffic are the same; the peak is
        the FP16 one (docs/sources.md 5.4).
        """
        if precision == "fp8" and self.fp8_flops is None:
            return (f"{self.name} has no FP8 tensor cores: the estimate uses its "
                    f"{self.half_precision_dtype.upper()} peak")
        if self.half_precision_dtype == "fp16":
            return (f"{self.name} has no BF16: the estimate is for FP16 mixed precision (same "
                    "2-byte values; train with fp16 and loss scaling)")
        return None
