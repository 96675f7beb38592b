"""A pick predicted faster than any measured run on its GPU says so (issue 16, honest picks).

The ceiling is data, not a constant picked by hand: bench/mfu_ceiling.py computes it from
bench/data/published-runs.json, and the shipped table must be what it prints. Its multi-node
A100-80GB entry is Korthikanti et al. 2022's 1T-parameter run, whose paper reports 56.3 % MFU
(Table 5, selective recomputation + sequence parallelism): placer's MFU convention gives the
same figure for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from placer.cost import estimate
from placer.cost.validity import MEASURED_MFU_CEILING, beyond_measured_mfu
from placer.mesh import DEFAULT_ORDER
from placer.report.explain import explain
from placer.spec import Job, Layout
from placer.spec.presets import cluster_preset, model_preset

ROOT = Path(__file__).resolve().parents[1]


def test_the_multi_node_a100_ceiling_is_korthikantis_published_mfu() -> None:
    assert MEASURED_MFU_CEILING[("A100-80GB", "bf16", True)] == (
        0.563, "korthikanti22_1T_selective_sp")


def test_beyond_the_ceiling_or_without_data_the_pick_says_so() -> None:
    above = beyond_measured_mfu(0.623, "A100-80GB", "bf16", True)
    assert above is not None and "56.3%" in above and "korthikanti22_1T" in above
    assert beyond_measured_mfu(0.55, "A100-80GB", "bf16", True) is None
    # Eight-GPU llm-foundry runs reach 64.1 % inside one node: a single-node pick may too.
    assert beyond_measured_mfu(0.60, "A100-80GB", "bf16", False) is None
    assert beyond_measured_mfu(0.30, "L40S", "bf16", True) == (
        "no measured L40S bf16 run across nodes in the calibration data")


def test_gpt3_on_1024_a100_above_every_measured_run_is_flagged_in_the_why() -> None:
    model, cluster = model_preset("gpt3-175b"), cluster_preset("dgx-a100").with_nodes(128)
    job = Job(seq_len=2048, global_batch_size=1536)
    layout = Layout.parse("tp=8,pp=8,dp=16,vpp=12,mbs=1,zero=1,recompute=none,sp=on",
                          num_gpus=1024)
    est = estimate(model, cluster, job, layout, order=DEFAULT_ORDER)
    lines = explain(model, cluster, job, [est], None, [])
    flagged = [line for line in lines if line.startswith("Unvalidated:")]
    ceiling = MEASURED_MFU_CEILING[("A100-80GB", "bf16", True)][0]
    # beyond_measured_mfu compares at the table's precision: equal to the ceiling is reached.
    assert (len(flagged) == 1) == (round(est.mfu, 3) > ceiling), (est.mfu, lines)


@pytest.mark.slow
def test_the_shipped_ceiling_is_what_the_calibration_data_gives() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import accuracy  # noqa: PLC0415  (bench helpers)
    import mfu_ceiling  # noqa: PLC0415

    cases, _, _ = accuracy.load()
    table = mfu_ceiling.ceilings(accuracy.run(cases), mfu_ceiling.fp4_records())
    assert table == MEASURED_MFU_CEILING, "rerun bench/mfu_ceiling.py into placer/cost/validity.py"
