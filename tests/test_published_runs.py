"""The calibration data (bench/data/published-runs.json): every row cited, every row loads.

A row "loads" when bench/accuracy.py turns it into placer inputs (a model, a cluster, a job and a
Layout that placer's own validation accepts), or skips it with a stated reason that is about the
source (a model without dimensions, a layout the source does not give), never because a field is
malformed. The counts guard issue #15's floor: 200 measured rows from 8 independent sources.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "bench" / "data" / "published-runs.json"
sys.path.insert(0, str(REPO / "bench"))

import accuracy  # noqa: E402

DATA = json.loads(RUNS.read_text(encoding="utf-8"))
RECORDS = DATA["records"]
# Reasons a row may be skipped: the source does not give what placer needs.
SOURCE_GAPS = ("not stated", "no dimensions given", "not given", "no cluster preset",
               "the source reports a known regression")


def test_ids_are_unique() -> None:
    ids = Counter(r["id"] for r in RECORDS)
    assert [i for i, n in ids.items() if n > 1] == []


@pytest.mark.parametrize("source_id", sorted(DATA["sources"]))
def test_every_source_has_a_citation_and_an_address(source_id: str) -> None:
    source = DATA["sources"][source_id]
    assert source.get("citation") and source.get("used"), source_id
    assert str(source.get("url", "")).startswith("https://"), source_id


def test_every_row_names_its_source_and_the_row_in_it() -> None:
    bad = [r["id"] for r in RECORDS
           if r["source_id"] not in DATA["sources"] or not r.get("source_locator")
           or not r["result"].get("as_reported")]
    assert bad == []


def test_every_measured_row_states_its_throughput() -> None:
    missing = [r["id"] for r in RECORDS if r["result"]["status"] == "measured"
               and not any(r["result"].get(k) for k in
                           ("tokens_per_sec_per_gpu", "step_time_s", "tflops_per_gpu", "mfu_pct"))]
    assert missing == []


def test_every_row_loads_or_is_skipped_for_a_gap_in_its_source() -> None:
    malformed = []
    for record in RECORDS:
        try:
            case = accuracy.case_for(record)
        except accuracy.Skip as why:
            if not any(gap in str(why) for gap in SOURCE_GAPS):
                malformed.append((record["id"], str(why)))
            continue
        assert case.layout.num_gpus == record["hardware"]["num_gpus"], record["id"]
        if not case.oom:
            assert case.reported_tps > 0, record["id"]
    assert malformed == []


def test_the_calibration_set_meets_the_issue_floor() -> None:
    cases, _, _ = accuracy.load(RUNS)
    measured = [c for c in cases if not c.oom]
    sources = {c.source for c in measured}
    assert len(measured) >= 200, len(measured)
    assert len(sources) >= 8, sorted(sources)


def test_megatron_bridge_rows_split_their_global_batch_into_micro_batches() -> None:
    """Megatron splits a step's global batch into GBS / (MBS x DP) micro-batches per rank and
    refuses a global batch that does not divide (megatron-core num_microbatches_calculator.py:
    'global batch size ... is not divisible by micro batch size ... times data parallel size'):
    a Bridge row whose MBS, GA and DP do not multiply to its GBS has a misread field (the 25.11
    H100 GPT-OSS row printed the B200 row's MBS 4 and GA 2)."""
    bad = []
    for r in RECORDS:
        batch, dp = r["batch"], r["layout"].get("dp")
        if r["source_id"] not in accuracy.MEGATRON_BRIDGE_SOURCES or not dp:
            continue
        mbs, gbs, ga = (batch.get(k) for k in
                        ("micro_batch_size", "global_batch_size", "grad_accum_steps"))
        if mbs and gbs and (gbs % (mbs * dp) or (ga and ga * mbs * dp != gbs)):
            bad.append((r["id"], gbs, mbs, dp, ga))
    assert bad == []
