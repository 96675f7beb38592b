"""bench/accuracy.py runs each llm-foundry benchmark row with the attention its table ran.

The facts are llm-foundry's own benchmark scripts (cited at bench/accuracy.py
LLMFOUNDRY_FLASH2_TABLE): submit_benchmarks.py's --attn_impl defaults to 'triton' (MPT's
FlashAttention in Triton) and sweep.sh never passes it, while the Large Scale table's sweep.py
passes '--attn_impl flash' for 1b, 3b, 7b and 70b and '--attn_impl triton' for 13b and 30b
(mosaicml/llm-foundry@5e85bd6 scripts/train/benchmarking/sweep.py).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import accuracy  # noqa: E402

RECORDS = json.loads((REPO / "bench" / "data" / "published-runs.json").read_text())["records"]
FOUNDRY = [r for r in RECORDS if r["source_id"] == "LLMFOUNDRY_MPT"]
LARGE_SCALE = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"


def test_only_the_large_scale_tables_flash_sizes_run_flashattention_2() -> None:
    kernels = Counter((accuracy.llmfoundry_table(r) == LARGE_SCALE, r["model"]["name"],
                       accuracy.options_for(r).attention_kernel) for r in FOUNDRY)
    # sweep.py: flash for 1b, 3b, 7b, 70b; triton for 13b, 30b (three GPU counts each).
    for name in ("MPT-1B", "MPT-3B", "MPT-7B", "MPT-70B"):
        assert kernels[(True, name, "fa2")] == 3
    for name in ("MPT-13B", "MPT-30B"):
        assert kernels[(True, name, "fa_triton")] == 3
    # Every other table came from sweep.sh at submit_benchmarks.py's default.
    assert all(k == "fa_triton" for large, _, k in kernels if not large)
    assert sum(n for (_, _, k), n in kernels.items() if k == "fa2") == 12
    assert sum(n for (_, _, k), n in kernels.items() if k == "fa_triton") == 137


def test_each_records_notes_name_the_attention_it_ran() -> None:
    for record in FOUNDRY:
        kernel = accuracy.options_for(record).attention_kernel
        words = "FlashAttention-2" if kernel == "fa2" else "FlashAttention in Triton"
        assert words in record["notes"], record["id"]
        assert "attn_impl flash)" not in record["notes"]


def test_other_sources_keep_their_kernels() -> None:
    kernels = {r["source_id"]: accuracy.options_for(r).attention_kernel for r in RECORDS
               if r["source_id"] in ("TORCHTITAN_2412", "MBRIDGE_PERF", "NEMO_LONGSEQ")}
    assert kernels == {"TORCHTITAN_2412": "fa2", "MBRIDGE_PERF": "cudnn",
                       "NEMO_LONGSEQ": "cudnn"}
