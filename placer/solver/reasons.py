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
from placer.units import gib_text


def _unconstrained(job: Job) -> Job:
    return job.model_copy(update={"constraints": ()})


def _degrees_text(degrees: Degrees) -> str:
    text = f"tp={degrees.tp},pp={degrees.pp},dp={degrees.dp},cp={degrees.cp}"
    return text + (f",ep={degrees.ep},etp={degrees.etp}" if degrees.ep * degrees.etp > 1 else "")


def no_degrees_reason(model: Model, job: Job, num_gpus: int, tp_capacity: Mapping[int, int],
                      all_tp: Mapping[int, int], *, exact: bool, nvlink_size: int) -> str:
    """No degree tuple passes: blame the NVLink rule, the job's constraints, or the rules."""
    if not job.allow_tp_outside_nvlink:
        relaxed = degree_tuples(model, job, num_gpus, all_tp, exact=exact)
        if relaxed:
            return (f"every valid layout of {num_gpus} GPUs needs tp={relaxed[0].tp} or more, "
                    f"but TP groups must stay inside an NVLink domain of {nvlink_size} GPUs; "
                    "set allow_tp_outside_nvlink in the job to allow it (slow)")
    if job.constraints:
        free = degree_tuples(model, _unconstrained(job), num_gpus, tp_capacity, exact=exact)
        if free:
            shown = ", ".join(str(c) for c in job.constraints)
            without = f"without them e.g. {_degrees_text(free[-1])} is valid"
            refused = _stack_refusal(model, job, num_gpus, tp_capacity, exact=exact)
            if refused is not None:
                return (f"{job.stack} refuses every layout of {num_gpus} GPUs the job's "
                        f"constraints ({shown}) allow: {refused[0]}: {refused[2]}; {without}")
            return (f"the job's constraints ({shown}) exclude every layout of {num_gpus} GPUs; "
                    f"{without}")
    return _rule_reason(model, job, num_gpus)


def _stack_refusal(model: Model, job: Job, num_gpus: int, tp_capacity: Mapping[int, int], *,
                   exact: bool) -> tuple[str, object, str] | None:
    """When the constraints allow layouts that only the job's stack refuses, why it refuses one
    of them (its stack rule); else None."""
    if job.stack is None:
        return None
    bare = degree_tuples(model, job.model_copy(update={"stack": None}), num_gpus, tp_capacity,
                         exact=exact)
    return layout_problem(bare[-1].layout(), model, job, num_gpus) if bare else None


_DIM_RULES = {"tp": "divides the attention heads", "pp": "at most one stage per layer",
              "cp": "2 x cp divides the sequence", "dp": "divides the global batch"}


def _rule_reason(model: Model, job: Job, num_gpus: int) -> str:
    """Which degree rule blocks: no product of individually valid degrees makes the GPU
    count, or else the rule most factorizations break."""
    free = _unconstrained(job)
    allowed: dict[str, list[int]] = {}
    for dim in ("tp", "pp", "cp", "dp"):
        allowed[dim] = [v for v in divisors(num_gpus)
                        if layout_problem(Degrees(1, 1, 1, 1).layout().model_copy(
                            update={dim: v}), model, free, v) is None]
    products = {t * p * c * d for t in allowed["tp"] for p in allowed["pp"]
                for c in allowed["cp"] for d in allowed["dp"]}
    if num_gpus not in products:
        sets = "; ".join(f"{dim} in {{{','.join(map(str, values))}}} ({_DIM_RULES[dim]})"
                         for dim, values in allowed.items())
        return (f"no parallel layout of {num_gpus} GPUs passes the degree rules for "
                f"{model.name}: tp x pp x cp x dp = {num_gpus} has no solution with {sets}; "
                "change the GPU count, the global batch or the sequence length")
    problems: Counter[tuple[str, str]] = Counter()
    example: dict[tuple[str, str], str] = {}
    for tp in divisors(num_gpus):
        for pp in divisors(num_gpus // tp):
            for cp in divisors(num_gpus // (tp * pp)):
                degrees = Degrees(tp, pp, num_gpus // (tp * pp * cp), cp)
                problem = layout_problem(degrees.layout(), model, free, num_gpus)
                if problem is None:
                    continue
                field, _, fix = problem
                key = (field, fix)
                problems[key] += 1
                example.setdefault(key, _degrees_text(degrees))
    key = min(problems, key=lambda k: (-problems[k], k))
    return (f"no parallel layout of {num_gpus} GPUs passes the degree rules for {model.name}; "
            f"{problems[key]} of {sum(problems.values())} fail like {example[key]}: "
            f"{key[0]} {key[1]}")


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
            f"({layout.compact()}) needs {gib_text(total)} per GPU ({largest} "
            f"{gib_text(parts[largest])}) but {gib_text(memory.capacity_bytes)} is usable after "
            f"the {job.memory_headroom:.0%} headroom; use more GPUs, a shorter sequence or a "
            "smaller micro-batch")
