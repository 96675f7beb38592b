"""The yardstick a recommendation is compared with: the stack's published recipe, else the rule an
engineer would write.

1. **The published recipe** (``placer.spec.recipe``): the stack's own tuned layout for the nearest
   model size (within 2x the parameters, same dense/MoE kind) on the same GPU type, nearest GPU
   count first. Its TP, PP, CP, EP, VPP, micro-batch, ZeRO and recompute are kept and DP takes
   the GPUs; it is used when that layout is valid for the job and fits.
2. **Else the engineer's rule**: TP = the GPUs of one NVLink domain (at most 8, the DGX/HGX
   node Megatron and NeMo recipes use) capped by the attention heads; EP inside the NVLink
   domain; CP only from 16K tokens (no published recipe uses CP > 2 below 16K; Llama 3 ran 128K
   at CP=16 with 8,192 tokens per rank, Dubey et al. 2024, Table 4); the smallest PP that fits,
   with no recompute unless the memory it saves is needed (then selective, then full); the
   distributed optimizer (ZeRO-1) when there is data parallelism; micro-batch 1; SP with TP.

The user's --constraint flags do not apply: the yardstick is what a team would run without them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placer.cost.params import total_params
from placer.cost.profile import bounding_node_type
from placer.mesh import DEFAULT_ORDER
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, layout_problem, zero_allowed
from placer.spec.model import Model
from placer.spec.presets import cluster_names, cluster_preset, model_names, model_preset
from placer.spec.recipe import Recipe, published_recipes
from placer.spec.results import Estimate
from placer.units import gib

EstimateFn = Callable[..., Estimate]
TP_CAP = 8  # TP=8 inside a DGX/HGX node: the Megatron-LM recipes (docs/sources.md section 10.1)
CP_TOKENS_PER_RANK = 8192  # Llama 3 long context: 131,072 tokens at CP=16 (Dubey et al., Table 4)
CP_FROM_TOKENS = 16384  # no published recipe uses CP > 2 below 16K tokens (recipes.yaml)
RECIPE_SIZE_RATIO = 2.0  # a recipe transfers to models within 2x of its parameter count
DEFAULT_STACK = "megatron-core"
RULE_TEXT = ("TP inside the NVLink domain, EP inside it too, CP only from 16K tokens, the "
             "smallest PP that fits, recompute only if needed, DP for the rest")


@dataclass(frozen=True)
class Baseline:
    """The yardstick's layout and estimate, or why there is none (``note``).

    ``recipe`` is the published recipe it comes from (None: the engineer's rule).
    """

    layout: Layout | None
    estimate: Estimate | None
    note: str = ""
    recipe: Recipe | None = None

    @property
    def name(self) -> str:
        """How the report names it."""
        if self.recipe is not None:
            return f"the published recipe {self.recipe.id}"
        return "the engineer's rule"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _nvlink_domain(cluster: Cluster) -> int:
    return min(cluster.node_type_named(p.node_type).nvlink_domain_size for p in cluster.pools)


def default_tp(model: Model, cluster: Cluster, num_gpus: int) -> int:
    """The largest TP <= 8 that fits in every node's NVLink domain and divides the heads."""
    cap = max(1, min(TP_CAP, _nvlink_domain(cluster)))
    for tp in range(cap, 0, -1):
        kv = model.kv_heads
        if (model.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)
                and num_gpus % tp == 0):
            return tp
    return 1


def default_cp(seq_len: int, gpus_left: int) -> int:
    """No CP below 16K tokens; beyond, the smallest power of two leaving each rank <= 8K."""
    cp = 1
    if seq_len < CP_FROM_TOKENS:
        return cp
    while seq_len // cp > CP_TOKENS_PER_RANK and gpus_left % (2 * cp) == 0 \
            and seq_len % (4 * cp) == 0:
        cp *= 2
    return cp


def default_ep(model: Model, cluster: Cluster, dense_grid: int) -> int:
    """The most experts ranks inside one NVLink domain: the largest divisor of the expert count
    that fits the domain and divides the dense grid tp*cp*dp (1 for dense models)."""
    if model.moe is None:
        return 1
    domain = _nvlink_domain(cluster)
    fits = [e for e in _divisors(model.moe.num_experts) if e <= domain and dense_grid % e == 0]
    return max(fits)


def _gpu_name(cluster: Cluster) -> str:
    return bounding_node_type(cluster).gpu.name


def _recipe_gpu(recipe: Recipe) -> str | None:
    if recipe.cluster not in cluster_names():
        return None
    return _gpu_name(cluster_preset(recipe.cluster))


def nearest_recipes(model: Model, cluster: Cluster, num_gpus: int,
                    stack: str = DEFAULT_STACK, seq_len: int | None = None) -> list[Recipe]:
    """The stack's recipes for this GPU type and a model within 2x the size, nearest first:
    by parameters, then GPU count, then sequence length; on a tie the later row of the recipe
    files, which list each stack's tables oldest first."""
    params = total_params(model)
    gpu = _gpu_name(cluster)
    found: list[tuple[float, str, Recipe]] = []
    for recipe in published_recipes():
        if recipe.stack != stack or recipe.model not in model_names():
            continue
        theirs = model_preset(recipe.model)
        if (theirs.moe is None) != (model.moe is None) or _recipe_gpu(recipe) != gpu:
            continue
        size = abs(math.log(params / total_params(theirs)))
        if size > math.log(RECIPE_SIZE_RATIO):
            continue
        distance = size + 0.5 * abs(math.log(num_gpus / recipe.num_gpus))
        if seq_len is not None:
            distance += 0.25 * abs(math.log(seq_len / recipe.seq_len))
        found.append((round(distance, 9), -published_recipes().index(recipe), recipe))
    return [recipe for _, _, recipe in sorted(found, key=lambda x: (x[0], x[1]))]


def recipe_layout(recipe: Recipe, model: Model, job: Job,
                  num_gpus: int) -> tuple[Layout | None, str]:
    """The recipe's layout moved to ``num_gpus`` (DP takes the GPUs; CP shrinks with a shorter
    sequence; micro-batch 1 if the batch needs it), or why it does not transfer."""
    lay = recipe.parsed_layout()
    cp = lay.cp
    while cp > 1 and job.seq_len * lay.cp < recipe.seq_len * cp:
        cp //= 2  # the recipe's tokens per CP rank, not its CP degree, is what it tuned
    fixed = lay.tp * lay.pp * cp
    if num_gpus % fixed:
        return None, f"its tp*pp*cp={fixed} does not divide {num_gpus} GPUs"
    dp = num_gpus // fixed
    moved = lay.model_copy(update={"dp": dp, "cp": cp})
    if job.global_batch_size % (dp * moved.micro_batch_size):
        moved = moved.model_copy(update={"micro_batch_size": 1})
    problem = layout_problem(moved, model, job, num_gpus)
    if problem is not None:
        return None, f"{problem[0]}={problem[1]} {problem[2]}"
    return moved, ""


def _plain(job: Job) -> Job:
    return Job.model_validate({**job.model_dump(), "constraints": []})


def recipe_default(model: Model, cluster: Cluster, job: Job, num_gpus: int,
                   estimate_fn: EstimateFn, profile: Any = None,
                   stack: str = DEFAULT_STACK) -> tuple[Baseline | None, str]:
    """The nearest published recipe that transfers and fits, or why none does ("" if none)."""
    plain = _plain(job)
    why = ""
    for recipe in nearest_recipes(model, cluster, num_gpus, stack, job.seq_len):
        layout, problem = recipe_layout(recipe, model, plain, num_gpus)
        if layout is None:
            why = why or f"the nearest recipe {recipe.id} does not transfer: {problem}"
            continue
        estimate = estimate_fn(model, cluster, plain, layout, order=DEFAULT_ORDER,
                               profile=profile)
        if estimate.fits:
            return Baseline(layout, estimate, recipe=recipe), ""
        mem = estimate.memory
        why = why or (f"the nearest recipe {recipe.id} ({layout.compact()}) needs "
                      f"{gib(mem.total_bytes)} of {gib(mem.capacity_bytes)} GiB per GPU here")
    return None, why


def rule_default(model: Model, cluster: Cluster, job: Job, num_gpus: int,
                 estimate_fn: EstimateFn, profile: Any = None) -> Baseline:
    """The engineer's rule of the module docstring, estimated with the cost model."""
    plain = _plain(job)
    tp = default_tp(model, cluster, num_gpus)
    cp = default_cp(job.seq_len, num_gpus // tp)
    tightest: Estimate | None = None
    problem = f"no PP degree divides {num_gpus // (tp * cp)}"
    for pp in _divisors(num_gpus // (tp * cp)):
        dp = num_gpus // (tp * cp * pp)
        ep = default_ep(model, cluster, tp * cp * dp)
        for recompute in ("none", "selective", "full"):
            layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch_size=1,
                            zero_stage=1 if zero_allowed(dp, cp) else 0, recompute=recompute,
                            sequence_parallel=tp > 1)
            found = layout_problem(layout, model, plain, num_gpus)
            if found is not None:
                if pp == 1:
                    problem = f"{found[0]}={found[1]} {found[2]}"
                break
            estimate = estimate_fn(model, cluster, plain, layout, order=DEFAULT_ORDER,
                                   profile=profile)
            if estimate.fits:
                return Baseline(layout, estimate)
            if tightest is None or estimate.peak_memory_bytes < tightest.peak_memory_bytes:
                tightest = estimate
    with_cp = f", CP={cp}" if cp > 1 else ""
    if tightest is None:
        return Baseline(None, None, f"no PP degree gives a valid layout with TP={tp}{with_cp} on "
                                    f"{num_gpus} GPUs (at PP=1: {problem})")
    mem = tightest.memory
    return Baseline(None, None,
                    f"it does not fit at any PP degree with TP={tp}{with_cp}: the best "
                    f"({tightest.layout.compact()}) needs {gib(mem.total_bytes)} GiB per GPU "
                    f"of {gib(mem.capacity_bytes)} GiB")


def stack_family(job: Job) -> str:
    """``megatron-core`` of ``megatron-core@0.20``: what a recipe's ``stack`` names."""
    return job.stack.split("@", 1)[0] if job.stack else DEFAULT_STACK


def common_default(model: Model, cluster: Cluster, job: Job, num_gpus: int,
                   estimate_fn: EstimateFn, profile: Any = None,
                   stack: str | None = None) -> Baseline:
    """The published recipe of the job's stack when one transfers and fits, else the engineer's
    rule; a rule baseline's note says why no recipe was used (when one was near)."""
    stack = stack or stack_family(job)
    found, why = recipe_default(model, cluster, job, num_gpus, estimate_fn, profile, stack)
    if found is not None:
        return found
    rule = rule_default(model, cluster, job, num_gpus, estimate_fn, profile)
    if why and rule.layout is not None:
        return Baseline(rule.layout, rule.estimate, note=why)
    return rule
