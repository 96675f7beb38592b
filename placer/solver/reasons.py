"""Why nothing fits: the tightest reason, as one line a user can act on.

Reasons are tried from the most binding to the least: not enough memory even fully sharded, the
job's own constraints, the NVLink rule, the degree rules (divisibility), then memory for the
layouts that remain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from placer.cost import minimum_gpus_needed
from placer.solver.space import Degrees, degree_tuples, divisors
from placer.solver.table import TableStats
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import layout_problem
from placer.spec.model import Model


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"


def _unconstrained(job: Job) -> Job:
    return job.model_copy(update={"constraints": ()})


def no_degrees_reason(model: Model, job: Job, num_gpus: int, tp_capacity: Mapping[int, int],
                      all_tp: Mapping[int, int], *, exact: bool, nvlink_size: int) -> str:
    """No degree tuple passes: blame the job's constraints, the NVLink rule, or the rules."""
    if job.constraints:
        free = degree_tuples(model, _unconstrained(job), num_gpus, tp_capacity, exact=exact)
        if free:
            shown = ", ".join(str(c) for c in job.constraints)
            return (f"the job's constraints ({shown}) exclude every layout of {num_gpus} GPUs; "
                    f"without them e.g. {free[-1].layout().compact()} is valid")
    if not job.allow_tp_outside_nvlink:
        relaxed = degree_tuples(model, job, num_gpus, all_tp, exact=exact)
        if relaxed:
            return (f"every valid layout of {num_gpus} GPUs needs tp={relaxed[0].tp} or more, "
                    f"but TP groups must stay inside an NVLink domain of {nvlink_size} GPUs; "
                    "set allow_tp_outside_nvlink in the job to allow it (slow)")
    return _rule_reason(model, job, num_gpus)


def _rule_reason(model: Model, job: Job, num_gpus: int) -> str:
    """The degree rule most layouts of ``num_gpus`` GPUs break, with an example."""
    problems: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for tp in divisors(num_gpus):
        for pp in divisors(num_gpus // tp):
            for cp in divisors(num_gpus // (tp * pp)):
                dp = num_gpus // (tp * pp * cp)
                layout = Degrees(tp, pp, dp, cp).layout()
                problem = layout_problem(layout, model, _unconstrained(job), num_gpus)
                if problem is None:
                    continue
                field, _, fix = problem
                key = (field, fix.split("=")[0])
                problems[key] += 1
                example.setdefault(key, f"{layout.compact().split(',vpp')[0]}: {field} {fix}")
    if not problems:
        return f"no parallel layout of {num_gpus} GPUs is valid for {model.name}"
    key = min(problems, key=lambda k: (-problems[k], k))
    return (f"no parallel layout of {num_gpus} GPUs passes the degree rules for {model.name}; "
            f"{problems[key]} of {sum(problems.values())} fail like {example[key]}")


def memory_reason(model: Model, cluster: Cluster, job: Job, stats: TableStats) -> str:
    """Nothing fits in memory: the GPU-count bound, else the smallest footprint seen."""
    need = minimum_gpus_needed(model, cluster, job)
    if cluster.num_gpus < need.gpus:
        return need.reason
    constrained = " under the job's constraints" if job.constraints else ""
    if stats.smallest is None:
        return f"no layout fits in GPU memory{constrained}"
    total, layout, memory = stats.smallest
    parts = {"weights": memory.weights_bytes, "gradients": memory.gradients_bytes,
             "optimizer state": memory.optimizer_bytes, "activations": memory.activations_bytes}
    largest = max(parts, key=lambda k: (parts[k], k))
    return (f"no layout fits in GPU memory{constrained}: the smallest footprint "
            f"({layout.compact()}) needs {_gb(total)} per GPU ({largest} "
            f"{_gb(parts[largest])}) but {_gb(memory.capacity_bytes)} is usable after the "
            f"{job.memory_headroom:.0%} headroom; use more GPUs, a shorter sequence or a "
            "smaller micro-batch")
