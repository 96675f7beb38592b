"""The highest MFU any measured run in the calibration data reached, per GPU, precision and
whether the run spans nodes.

A pick predicted above it rests on the cost model alone: no run it was checked against went that
fast on that GPU (issue 16, honest picks). Runs inside one node never cross the inter-node
network, so they bound only single-node picks: eight-GPU llm-foundry MPT runs reach 64 % on
A100-80GB, runs over many nodes at most 56 % (Korthikanti et al.'s 1T model). MFU is counted
the way placer counts a prediction (``Estimate.mfu``: placer's model FLOPs per token over the
GPU's dense peak at the job's precision), so a run's is its estimate's MFU scaled by measured
over predicted tokens/s; the source's own MFU convention (Megatron's, PaLM's, hardware FLOPs)
would not compare. Prints the table ``placer.cost.validity.MEASURED_MFU_CEILING`` ships
(tests/test_mfu_ceiling.py checks that they agree).

    .venv/bin/python bench/mfu_ceiling.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from accuracy import RUNS, Outcome, load, run  # noqa: E402


def measured_mfu(outcome: Outcome) -> float:
    """The run's MFU in placer's convention."""
    return outcome.estimate.mfu * outcome.case.reported_tps / outcome.predicted_tps


def ceilings(outcomes: list[Outcome], fp4: frozenset[str] = frozenset()
             ) -> dict[tuple[str, str, bool], tuple[float, str]]:
    """(GPU name, precision, spans nodes) -> (the highest measured MFU, the record); ``fp4``:
    records left out, FP4 runs (bench/accuracy.py costs them as FP8, but their GEMMs run at
    the FP4 rate, so their MFU against the FP8 peak is no FP8 ceiling)."""
    best: dict[tuple[str, str, bool], tuple[float, str]] = {}
    for outcome in outcomes:
        case = outcome.case
        if case.oom or case.record_id in fp4:
            continue
        node = case.cluster.node_types[0]
        key = (node.gpu.name, case.job.precision, case.layout.num_gpus > node.gpus_per_node)
        mfu = round(measured_mfu(outcome), 3)
        if key not in best or (mfu, case.record_id) > best[key]:
            best[key] = (mfu, case.record_id)
    return dict(sorted(best.items()))


def fp4_records(path: Path = RUNS) -> frozenset[str]:
    records = json.loads(path.read_text(encoding="utf-8"))["records"]
    return frozenset(r["id"] for r in records if "fp4" in (r.get("precision") or "").lower())


def main() -> int:
    cases, _, _ = load()
    table = ceilings(run(cases), fp4_records())
    print("MEASURED_MFU_CEILING: dict[tuple[str, str, bool], tuple[float, str]] = {")
    for (gpu, precision, nodes), (mfu, record) in table.items():
        print(f'    ("{gpu}", "{precision}", {nodes}): ({mfu}, "{record}"),')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
