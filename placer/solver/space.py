"""Candidate space: the degree tuples and knob settings that can run, before any costing.

Degrees come first (``tp x pp x dp x cp`` = GPUs used; ``ep``, ``etp`` on the expert sub-grid),
then the knobs (micro-batch, virtual stages, ZeRO stage, recompute, sequence parallelism). Every
layout is filtered with ``layout_problem``, the one validation function. The pre-check on a
tuple's *base* layout (knobs at their least demanding values) only skips work: each knob adds
conditions and never removes one, so a tuple whose base layout fails has no valid layout at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache

from placer.cost.memo import BATCH_FIELDS, cached, new_cache, text_key
from placer.dims import LAYOUT_DIMS
from placer.spec.job import Job
from placer.spec.layout import (
    RECOMPUTE_CHOICES,
    Layout,
    layout_problem,
    sp_allowed,
    zero_allowed,
)
from placer.spec.model import Model
from placer.spec.stack import load_stack

MBS_CAP = 16
"""Largest micro-batch tried, in sequences. Published large runs use 1-16 (Megatron SC'21 Table 1
scripts go up to 16, published-runs.json); bigger ones only add activation memory."""

VPP_CAP = 16
"""Most virtual stages per pipeline rank tried; Megatron's interleaved runs use 2-8 and every
extra stage adds a point-to-point exchange per micro-batch (docs/sources.md 6.2)."""

DP_CHOICES_IRREGULAR = 2
"""On clusters that cannot use every healthy GPU, how many of the largest valid DP degrees are
kept per (tp, pp, cp, ep, etp): fewer data-parallel replicas than that means idle nodes."""

RECOMPUTE_MODES = RECOMPUTE_CHOICES
"""Every recompute mode, least recomputation first (the order ties and constraints use)."""
SEARCHED_RECOMPUTE = ("none", "selective", "full")
"""Modes searched without a stack; with one, those the stack offers (torchtitan: op-level)."""
ZERO_STAGES = (0, 1, 2, 3)
DEGREE_KEYS = LAYOUT_DIMS


@dataclass(frozen=True, order=True)
class Degrees:
    """The parallel degrees of a layout, without its knobs."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int = 1
    etp: int = 1

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def layout(self, *, vpp: int = 1, mbs: int = 1, zero: int = 0, recompute: str = "none",
               sp: bool = False) -> Layout:
        """A Layout with these degrees; values are plain ints from this module, so skip checks.

        A copy of the tuple's base layout: ``model_copy`` is ~4x faster than ``model_construct``
        filling every default, and the search builds hundreds of thousands of layouts."""
        return _base_layout(self).model_copy(update={
            "vpp": vpp, "micro_batch_size": mbs, "zero_stage": zero, "recompute": recompute,
            "sequence_parallel": sp})

    @classmethod
    def of(cls, layout: Layout) -> Degrees:
        return cls(layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.etp)


@lru_cache(maxsize=65536)
def _base_layout(degrees: Degrees) -> Layout:
    """The layout of ``degrees`` with every knob at its default."""
    return Layout.model_construct(tp=degrees.tp, pp=degrees.pp, dp=degrees.dp, cp=degrees.cp,
                                  ep=degrees.ep, etp=degrees.etp)


@cache
def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of ``n``, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return tuple(small + large[::-1])


def _degree_job(job: Job) -> Job:
    """The job with only its constraints on degrees: knob constraints are checked per layout."""
    kept = tuple(c for c in job.constraints if c.key in DEGREE_KEYS)
    if kept == job.constraints:
        return job
    return job.model_copy(update={"constraints": kept})


def degree_tuples(model: Model, job: Job, num_gpus: int, tp_capacity: Mapping[int, int], *,
                  exact: bool) -> list[Degrees]:
    """Every degree tuple whose base layout passes ``layout_problem``, sorted.

    ``tp_capacity[tp]`` is how many GPUs can host TP groups of size ``tp`` (the NVLink rule and
    failed GPUs decide it; a tp missing from the map is not allowed). With ``exact`` the degrees
    must use all ``num_gpus``; otherwise (irregular clusters) any count up to the capacity, keeping
    the largest few DP degrees per model-parallel shape.
    """
    degree_job = _degree_job(job)
    out: list[Degrees] = []
    for tp in sorted(tp_capacity):
        limit = min(tp_capacity[tp], num_gpus)
        if limit < tp:
            continue
        # Every pipeline depth up to one layer per stage: layout_problem decides which splits
        # are allowed (uneven ones only without virtual stages), so the space follows the rule,
        # not a copy of it.
        pps = divisors(num_gpus // tp) if exact else range(1, limit // tp + 1)
        for pp in (p for p in pps if p <= model.num_layers):
            for cp in divisors(job.seq_len):
                base = tp * pp * cp
                if base > limit:
                    break
                if exact:
                    dps = [num_gpus // base] if limit == num_gpus and num_gpus % base == 0 else []
                else:
                    dps = [d for d in divisors(job.global_batch_size) if base * d <= limit]
                    dps = dps[-DP_CHOICES_IRREGULAR:]
                for dp in dps:
                    out.extend(_expert_splits(model, degree_job, tp, pp, dp, cp))
    return sorted(out)


def _expert_splits(model: Model, job: Job, tp: int, pp: int, dp: int,
                   cp: int) -> Iterator[Degrees]:
    """(ep, etp) choices for one dense tuple; (1, 1) for dense models."""
    if model.moe is None:
        pairs = [(1, 1)]
    else:
        grid = tp * cp * dp
        pairs = [(ep, etp) for etp in divisors(tp) for ep in divisors(model.moe.num_experts)
                 if grid % (ep * etp) == 0]
    for ep, etp in pairs:
        degrees = Degrees(tp, pp, dp, cp, ep, etp)
        if _base_runs(degrees, model, job):
            yield degrees


_BASE: dict[tuple[object, ...], bool] = new_cache()


def _base_runs(degrees: Degrees, model: Model, job: Job) -> bool:
    """Whether ``layout_problem`` passes the tuple's base layout (one virtual stage, micro-batch
    1, 1F1B). The global batch enters it only through ``dp`` dividing it (in the key), so the
    verdict is cached without it (memo.BATCH_FIELDS): the what-ifs at half and twice the batch
    find the main search's (DeepSeek-V3 on 2,048 GPUs: 3,759 verdicts, an (ep, etp) split of
    every dense tuple)."""
    key = (text_key(model), text_key(job, BATCH_FIELDS), degrees,
           job.global_batch_size % degrees.dp == 0)
    return cached(_BASE, key, lambda: layout_problem(degrees.layout(), model, job,
                                                     degrees.num_gpus) is None)


@dataclass(frozen=True)
class KnobOptions:
    """The knob values worth trying for one degree tuple, each already allowed by the job's
    constraints on that knob (a constraint names one key, so filtering per key is exact)."""

    mbs: tuple[int, ...]
    vpp_by_mbs: tuple[tuple[int, ...], ...]
    zero: tuple[int, ...]
    recompute: tuple[str, ...]
    sp: tuple[bool, ...]

    def count(self) -> int:
        """Layouts of the tuple (the product of the options; vpp depends on the micro-batch)."""
        per_vpp = len(self.zero) * len(self.recompute) * len(self.sp)
        return sum(len(v) for v in self.vpp_by_mbs) * per_vpp


def _allowed(job: Job, key: str, values: list[object], subject: Callable[[object],
             int | str]) -> tuple:
    for constraint in job.constraints:
        if constraint.key == key:
            values = [v for v in values if constraint.allows(subject(v))]
    return tuple(values)


def knob_options(degrees: Degrees, model: Model, job: Job) -> KnobOptions:
    """Micro-batches (powers of two up to ``MBS_CAP`` dividing the per-replica batch: the GEMM
    shapes frameworks tune for; any size the job names), virtual stages, ZeRO stages,
    recompute modes, SP on/off."""
    per_replica = job.global_batch_size // degrees.dp
    named = {int(v) for c in job.constraints if c.key == "mbs" and c.op in ("=", "in")
             for v in c.values}
    mbs = [m for m in divisors(per_replica)
           if m in named or (m <= MBS_CAP and m & (m - 1) == 0)]
    mbs_ok = _allowed(job, "mbs", list(mbs), int)
    layers_per_stage = model.num_layers // degrees.pp
    degree_job = _degree_job(job)  # knob constraints are applied per key below
    vpp_by_mbs = []
    for m in mbs_ok:
        microbatches = per_replica // m
        vpps = [1]
        if degrees.pp > 1 and microbatches % degrees.pp == 0:
            vpps += [v for v in range(2, min(VPP_CAP, layers_per_stage) + 1)
                     if _searched_vpp(model.num_layers, degrees.pp, v)
                     and _interleaving_runs(degrees, model, job, degree_job, v, m)]
        vpp_by_mbs.append(_allowed(job, "vpp", list(vpps), int))
    zero = list(ZERO_STAGES) if zero_allowed(degrees.dp, degrees.cp) else [0]
    sp = [False, True] if sp_allowed(degrees.tp, job.seq_len) else [False]
    recompute = list(SEARCHED_RECOMPUTE)
    if job.stack is not None:  # only what the stack runs (placer.spec.stack)
        stack = load_stack(job.stack)
        zero = [z for z in zero if z in stack.zero_stages]
        recompute = [r for r in RECOMPUTE_MODES if r in stack.recompute]
        if "sequence_parallel" not in stack.layout_fields:
            sp = [False]
    return KnobOptions(
        mbs=mbs_ok, vpp_by_mbs=tuple(vpp_by_mbs),
        zero=_allowed(job, "zero", zero, int),
        recompute=_allowed(job, "recompute", recompute, str),
        sp=_allowed(job, "sp", list(sp), lambda v: "on" if v else "off"))


_INTERLEAVING: dict[tuple[object, ...], bool] = new_cache()


def _interleaving_runs(degrees: Degrees, model: Model, job: Job, degree_job: Job, vpp: int,
                       mbs: int) -> bool:
    """Whether ``layout_problem`` passes ``degrees`` at ``vpp`` virtual stages and micro-batch
    ``mbs`` under ``degree_job`` (``job`` with its degree constraints only), where
    ``knob_options`` asks: ``mbs`` divides the per-replica batch into a multiple of ``pp``
    micro-batches. There the global batch enters only through ``dp * mbs`` dividing it (in the
    key; the interleaved schedule's and DualPipe's micro-batch counts then pass), so the verdict
    is cached without it (memo.BATCH_FIELDS; ``job``'s text also names its knob constraints):
    the what-ifs at half and twice the batch find the main search's. Nothing else reads the
    micro-batch's value but a stack rule's ``mbs`` condition (``degree_job`` keeps no ``mbs``
    constraint), so without one the verdict is shared by every micro-batch."""
    key = (text_key(model), text_key(job, BATCH_FIELDS), degrees, vpp,
           mbs if _rules_read_mbs(job.stack) else None,
           job.global_batch_size % (degrees.dp * mbs) == 0)
    return cached(_INTERLEAVING, key, lambda: layout_problem(
        degrees.layout(vpp=vpp, mbs=mbs), model, degree_job, degrees.num_gpus) is None)


@cache
def _rules_read_mbs(stack: str | None) -> bool:
    """Whether a rule of the job's stack tests the micro-batch (``mbs``)."""
    return stack is not None and any(condition.key == "mbs" for rule in load_stack(stack).rules
                                     for condition in rule.when)


def _searched_vpp(num_layers: int, pp: int, vpp: int) -> bool:
    """Virtual stages the search tries: an even split, or Megatron's embedding-and-loss-counted
    one (--account-for-embedding/loss-in-pipeline-split); explicit stage lists stay for
    ``estimate`` (the space would grow by every vpp up to VPP_CAP for little gain)."""
    counted = num_layers + 2
    return num_layers % (pp * vpp) == 0 or (counted % pp == 0 and (counted // pp) % vpp == 0)


def layout_key(layout: Layout) -> tuple[int, ...]:
    """A total order on layouts, used for every tie-break (same input -> same output)."""
    return (layout.tp, layout.pp, layout.dp, layout.cp, layout.ep, layout.etp, layout.vpp,
            layout.micro_batch_size, layout.zero_stage, RECOMPUTE_MODES.index(layout.recompute),
            int(layout.sequence_parallel))
