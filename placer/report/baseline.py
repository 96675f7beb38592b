"""The common default layout, the one a team would pick without placer, as a yardstick.

Rule (what Megatron-LM and NeMo recipes do by hand): TP = the largest valid degree up to 8 that
stays inside one NVLink domain; PP = the smallest degree that fits in memory; DP for the rest;
micro-batch 1, ZeRO-1 (distributed optimizer) when DP > 1, selective recompute, sequence
parallelism with TP. CP only beyond an 8K context: the smallest power of two that leaves each rank
8,192 tokens (Llama 3 ran 128K at CP=16, Dubey et al. 2024, Table 4). For MoE models EP =
gcd(experts, TP x DP): experts spread as widely as Megatron-Core's expert grid allows (Mixtral
recipes run EP=8). The user's --constraint flags do not apply: the yardstick is what a team
would run without thinking about them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from placer.dims import DEFAULT_ORDER
from placer.report.describe import gib
from placer.spec.cluster import Cluster
from placer.spec.job import Job
from placer.spec.layout import Layout, layout_problem
from placer.spec.model import Model
from placer.spec.results import Estimate

EstimateFn = Callable[..., Estimate]
TP_CAP = 8  # TP=8 inside a DGX/HGX node: the Megatron-LM recipes (conventions.md section 10.1)
CP_TOKENS_PER_RANK = 8192  # Llama 3 long context: 131,072 tokens at CP=16 (Dubey et al., Table 4)


@dataclass(frozen=True)
class Baseline:
    """The common default's layout and estimate, or why there is none (``note``)."""

    layout: Layout | None
    estimate: Estimate | None
    note: str = ""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_tp(model: Model, cluster: Cluster, num_gpus: int) -> int:
    """The largest TP <= 8 that fits in every node's NVLink domain and divides the heads."""
    domain = min(cluster.node_type_named(p.node_type).nvlink_domain_size for p in cluster.pools)
    cap = max(1, min(TP_CAP, domain))
    for tp in range(cap, 0, -1):
        kv = model.kv_heads
        if (model.num_attention_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)
                and num_gpus % tp == 0):
            return tp
    return 1


def default_cp(seq_len: int, gpus_left: int) -> int:
    """The smallest power of two that leaves each rank at most 8,192 tokens, if the GPUs allow."""
    cp = 1
    while seq_len // cp > CP_TOKENS_PER_RANK and gpus_left % (2 * cp) == 0 \
            and seq_len % (4 * cp) == 0:
        cp *= 2
    return cp


def common_default(model: Model, cluster: Cluster, job: Job, num_gpus: int,
                   estimate_fn: EstimateFn, profile: Any = None) -> Baseline:
    """The common default for ``num_gpus`` GPUs, estimated with the cost model."""
    plain_job = Job.model_validate({**job.model_dump(), "constraints": []})
    tp = default_tp(model, cluster, num_gpus)
    cp = default_cp(job.seq_len, num_gpus // tp)
    tightest: Estimate | None = None
    problem = f"no PP degree divides {num_gpus // (tp * cp)}"
    for pp in _divisors(num_gpus // (tp * cp)):
        dp = num_gpus // (tp * cp * pp)
        ep = math.gcd(model.moe.num_experts, tp * dp) if model.moe else 1
        layout = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, micro_batch_size=1,
                        zero_stage=1 if dp > 1 else 0, recompute="selective",
                        sequence_parallel=tp > 1)
        found = layout_problem(layout, model, plain_job, num_gpus)
        if found is not None:
            if pp == 1:
                problem = f"{found[0]}={found[1]} {found[2]}"
            continue
        estimate = estimate_fn(model, cluster, plain_job, layout, order=DEFAULT_ORDER,
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
