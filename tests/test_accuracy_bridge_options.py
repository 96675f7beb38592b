"""bench/accuracy.py runs NVIDIA's rows with the TP overlap their performance configs set.

Each case is a fact of the framework's own source (cited at bench/accuracy.py
TP_OVERLAP_CONFIGS): Megatron-Bridge's Llama 3 70B and Llama 3.1 405B recipes overlap TP
communication (CommOverlapConfig(tp_comm_overlap=True)) except under NVFP4, and Qwen3-235B's H100
config does not; NeMo 24.07's launcher overlaps it for Llama 2/3 70B, not for GPT-3 175B.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import accuracy  # noqa: E402

RECORDS = json.loads((REPO / "bench" / "data" / "published-runs.json").read_text())["records"]
BRIDGE = [r for r in RECORDS if r["source_id"] in accuracy.MEGATRON_BRIDGE_SOURCES]


def _tp_overlap(record: dict) -> bool:
    return accuracy.options_for(record).tp_comm_overlap


def test_bridge_llama_recipes_overlap_tp_but_not_under_nvfp4() -> None:
    llama = [r for r in BRIDGE
             if accuracy._slug(r["model"]["name"]) in ("llama370b", "llama31405b")]
    nvfp4 = [r for r in llama if "nvfp4" in r["precision"].lower()]
    others = [r for r in llama if r not in nvfp4]
    assert len(nvfp4) >= 5 and len(others) >= 20
    assert all(_tp_overlap(r) for r in others)
    assert not any(_tp_overlap(r) for r in nvfp4)


def test_bridge_moe_and_8b_rows_do_not_overlap_tp() -> None:
    rest = [r for r in BRIDGE
            if accuracy._slug(r["model"]["name"]) not in ("llama370b", "llama31405b")]
    qwen_h100_tp2 = [r for r in rest if "qwen3235b" in accuracy._slug(r["model"]["name"])
                     and r["layout"]["tp"] == 2]
    assert qwen_h100_tp2
    assert not any(_tp_overlap(r) for r in rest)


def test_nemo_2407_overlaps_tp_for_llama_70b_only() -> None:
    nemo = [r for r in RECORDS if r["source_id"] == "NEMO_2407"]
    llama_70b = [r for r in nemo if "70b" in r["id"] and "llama" in r["id"]]
    assert len(llama_70b) == 2 and all(_tp_overlap(r) for r in llama_70b)
    gpt3 = [r for r in nemo if "gpt3-175b" in r["id"]]
    assert gpt3 and not any(_tp_overlap(r) for r in gpt3)


def test_sources_without_a_rule_keep_their_own_reading() -> None:
    """Llama 3 70B rows of other stacks (torchtitan, AutoModel) are not read as Megatron's."""
    other = [r for r in RECORDS if "70b" in accuracy._slug(r["model"]["name"])
             and r["source_id"] in ("TORCHTITAN_2412", "AUTOMODEL_2604")]
    assert other and not any(accuracy.framework_tp_overlap(r) for r in other)
