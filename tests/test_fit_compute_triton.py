"""bench/fit_compute fits FlashAttention in Triton's share of FlashAttention-2's throughput only
where rows run it, and leaves it at FlashAttention-2's rate (1.0) where none does, so a
leave-one-source-out fold without llm-foundry's rows predicts them with nothing they taught."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import accuracy  # noqa: E402
import fit_compute  # noqa: E402


def test_the_triton_share_is_fitted_only_with_rows_that_run_the_kernel() -> None:
    cases = [c for c in accuracy.load()[0] if not c.oom]
    foundry = [c for c in cases if c.source == "LLMFOUNDRY_MPT"]
    others = [c for c in cases if c.source != "LLMFOUNDRY_MPT"]
    assert any(c.options.attention_kernel == "fa_triton" for c in foundry)
    assert not any(c.options.attention_kernel == "fa_triton" for c in others)
    names = {name for _, name, _, _ in fit_compute.parameters(cases)}
    assert "triton_fa_relative" in names
    held_out = {name for _, name, _, _ in fit_compute.parameters(others)}
    assert "triton_fa_relative" not in held_out
    assert fit_compute.initial(fit_compute.parameters(others))["triton_fa_relative"] == 1.0
