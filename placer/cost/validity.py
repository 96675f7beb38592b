"""What the cost model's figures can be trusted for: its measured error, and where it was never
checked against a measurement.

- ``MODEL_ERROR``: the mean out-of-sample throughput error of the cost model. Two layouts whose
  predicted throughput differs by less than this are a tie: the model cannot rank them.
- ``unvalidated_mechanisms``: parts of a layout no measured run in the calibration set
  (bench/data/published-runs.json) exercises, so the figure rests on formulas alone.
"""

from __future__ import annotations

from placer.spec.job import Job
from placer.spec.layout import Layout

MODEL_ERROR = 0.091
"""Mean throughput error out of sample: ``bench/accuracy.py`` leave-one-source-out (every
fitted constant refitted on all sources but one, that one predicted), all 368 measured rows of 15
sources: 9.1 % (per source 2.0-26.2 %; in-sample 6.8 %), 2026-12-04 stop 27 (bench/results/
accuracy-2026-12-04-stop27.txt). Update it with that table's "all" row when the cost model changes;
bench/recipes.py prints the error on the published recipes beside it."""

MIN_VALIDATED_CP_TOKENS = 4096
"""The fewest tokens per context-parallel rank of any measured run: NeMo 24.07's Llama 3 8B and
70B at 8K with CP=2 (bench/data/published-runs.json); the torchtitan CP runs keep 16-32K per
rank. Shorter chunks change the attention kernels' efficiency and the ring's per-step overhead
relative to its compute, which nothing measured pins down."""


def unvalidated_mechanisms(layout: Layout, job: Job) -> list[str]:
    """One phrase per mechanism of ``layout`` the model has no measurement for (empty: none)."""
    found = []
    if layout.cp > 1 and job.seq_len / layout.cp < MIN_VALIDATED_CP_TOKENS:
        found.append(f"CP={layout.cp} at {job.seq_len:,} tokens ({job.seq_len // layout.cp:,} "
                     f"per rank; no measured run has fewer than {MIN_VALIDATED_CP_TOKENS:,})")
    return found


MEASURED_MFU_CEILING: dict[tuple[str, str, bool], tuple[float, str]] = {
    ("A100-40GB", "bf16", False): (0.594, "llmfoundry_a100_40_mpt3b_s512_8gpu"),
    ("A100-40GB", "bf16", True): (0.568, "llmfoundry_a100_40_mpt3b_s2048_32gpu"),
    ("A100-80GB", "bf16", False): (0.641, "llmfoundry_a100_80_mpt7b_s2048_8gpu"),
    ("A100-80GB", "bf16", True): (0.563, "korthikanti22_1T_selective_sp"),
    ("B200", "bf16", True): (0.211, "mbridge260201_b200_gptoss120b_bf16_64gpu"),
    ("B200", "fp8", False): (0.394, "mbridge2511_b200_llama3_8b_fp8_cs_8gpu"),
    ("B200", "fp8", True): (0.386, "mbridge2511_b200_llama3_1_405b_fp8_cs_128gpu"),
    ("GB200", "bf16", True): (0.353, "mbridge2511_gb200_deepseekv3_bf16_256gpu"),
    ("GB200", "fp8", True): (0.454, "mbridge260401_gb200_llama31405b_fp8_256gpu"),
    ("H100-SXM-80GB", "bf16", False): (0.464, "llmfoundry_h100bf16_mpt7b_s2048_8gpu"),
    ("H100-SXM-80GB", "bf16", True): (0.494, "mcore_r080_h100_weak_16B"),
    ("H100-SXM-80GB", "fp8", False): (0.423, "mbridge2511_h100_llama3_8b_fp8_cs_8gpu"),
    ("H100-SXM-80GB", "fp8", True): (0.435, "mbridge260401_h100_llama31405b_fp8_1024gpu"),
    ("H100-SXM-96GB", "bf16", False): (0.377, "torchtitan_2412_t1_fsdp_bf16"),
    ("H100-SXM-96GB", "bf16", True): (0.367, "torchtitan_2412_t3_fsdp_bf16_128gpu"),
    ("H100-SXM-96GB", "fp8", False): (0.279, "torchtitan_2412_t1_fsdp_compile_float8"),
    ("H100-SXM-96GB", "fp8", True): (0.274, "torchtitan_2412_t3_fsdp_compile_float8_128gpu"),
    ("H200-141GB", "fp8", True): (0.32, "trainy_h200_llama31_8b_32gpu"),
}
"""(GPU, precision, the run spans nodes) -> the highest MFU a measured run in
bench/data/published-runs.json reached, in placer's MFU convention, and that run's record id:
``bench/mfu_ceiling.py`` prints this table (FP4 runs and OOM rows left out;
tests/test_mfu_ceiling.py checks it against the data). Single-node runs never cross the
inter-node network, so they bound only single-node picks."""


def beyond_measured_mfu(mfu: float, gpu: str, precision: str, multi_node: bool) -> str | None:
    """Why a predicted MFU rests on the model alone: above every measured run of that GPU,
    precision and node span, or no such run at all (None: a run reached it)."""
    where = f"{gpu} {precision} run {'across nodes' if multi_node else 'on one node'}"
    ceiling = MEASURED_MFU_CEILING.get((gpu, precision, multi_node))
    if ceiling is None:
        return f"no measured {where} in the calibration data"
    if round(mfu, 3) <= ceiling[0]:  # the table's precision: equal to it is reached
        return None
    return (f"{mfu:.1%} MFU predicted, above the {ceiling[0]:.1%} of the best measured {where} "
            f"in the calibration data ({ceiling[1]})")


def validated_cp_limit(job: Job) -> int:
    """The largest CP degree whose per-rank chunk a measured run covers (at least 1)."""
    return max(1, job.seq_len // MIN_VALIDATED_CP_TOKENS)
