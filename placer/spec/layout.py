"""Parallel layout: degrees and knobs, its compact string form, and its one validation function.

``tp x pp x dp x cp`` is the GPU count. Experts are spread over a sub-grid of ``dp x cp`` (x ``tp``
when etp = 1), as in Megatron-Core and torchtitan: ``ep x etp`` divides ``tp x cp x dp`` and the
rest is expert data parallelism (``edp``).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, ValidationError

from placer.errors import InputError, from_validation_error
from placer.spec.base import Spec
from placer.spec.job import Job
from placer.spec.model import Model
from placer.spec.pipeline import (
    SCHEDULES,
    V_SCHEDULES,
    PipelineSplit,
    Schedule,
    default_schedule,
    resolve_split,
    schedule_problem,
)
from placer.spec.text import decimal

Recompute = Literal["none", "selective", "op", "full"]
RECOMPUTE_CHOICES = ("none", "selective", "op", "full")
"""``selective``: Megatron's ``--recompute-granularity selective`` of ``recompute_modules``;
``op``: torchtitan's per-op selective activation checkpointing (``activation_checkpoint.mode =
"selective"``, ``selective_ac_option = "op"``); ``full``: whole layers (``recompute_layers`` of
them per virtual stage when set, Megatron's ``--recompute-method block``)."""
RecomputeModule = Literal["core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe",
                          "shared_experts"]
RECOMPUTE_MODULES = ("core_attn", "mlp", "moe_act", "layernorm", "mla_up_proj", "moe",
                     "shared_experts")
"""Megatron-Core ``--recompute-modules`` (megatron/training/arguments.py; default core_attn)."""

# compact key -> field name
_SHORT_KEYS = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "etp": "etp", "vpp": "vpp",
    "mbs": "micro_batch_size", "micro_batch_size": "micro_batch_size",
    "zero": "zero_stage", "zero_stage": "zero_stage", "fsdp": "zero_stage",
    "recompute": "recompute", "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
    "schedule": "schedule", "first": "first_stage_layers", "last": "last_stage_layers",
    "emb": "embedding_in_split", "loss": "loss_in_split", "pplayout": "pp_layout",
    "stages": "stage_layers", "rmodules": "recompute_modules", "rlayers": "recompute_layers",
    "offload": "offload_layers", "shard": "dp_shard", "reshard": "reshard_after_forward",
}
_BOOLEAN_FIELDS = ("sequence_parallel", "embedding_in_split", "loss_in_split",
                   "reshard_after_forward")
_TRUE = {"on", "true", "1", "yes"}
_FALSE = {"off", "false", "0", "no"}
LAYOUT_FORM = "tp=8,pp=4,dp=32,mbs=1,zero=1,recompute=selective,sp=on"


def sp_allowed(tp: int, seq_len: int) -> bool:
    """Sequence parallelism needs tp > 1 and tp dividing the sequence (it splits it over the
    TP ranks); the one rule the search and the validation share."""
    return tp > 1 and seq_len % tp == 0


def zero_allowed(dp: int, cp: int) -> bool:
    """ZeRO shards over the dp x cp ranks; with one there is nothing to shard."""
    return dp * cp > 1


class Layout(Spec):
    """Degrees and knobs of one candidate; see the module docstring for how they relate."""

    tp: int = Field(default=1, ge=1, le=1_000_000)
    pp: int = Field(default=1, ge=1, le=1_000_000)
    dp: int = Field(default=1, ge=1, le=1_000_000)
    cp: int = Field(default=1, ge=1, le=1_000_000)
    ep: int = Field(default=1, ge=1, le=1_000_000)
    etp: int = Field(default=1, ge=1, le=1_000_000, description="expert tensor parallel")
    vpp: int = Field(default=1, ge=1, le=1024, description="virtual stages per pipeline rank")
    micro_batch_size: int = Field(default=1, ge=1, le=1_000_000)
    zero_stage: int = Field(default=0, ge=0, le=3, description="3 = FSDP full shard")
    recompute: Recompute = "none"
    sequence_parallel: bool = False
    schedule: Schedule | None = Field(
        default=None, description="pipeline schedule (default 1f1b, interleaved with vpp > 1)")
    first_stage_layers: int | None = Field(
        default=None, ge=1, le=10_000, description="Megatron --decoder-first-pipeline-num-layers")
    last_stage_layers: int | None = Field(
        default=None, ge=1, le=10_000, description="Megatron --decoder-last-pipeline-num-layers")
    embedding_in_split: bool = Field(
        default=False, description="Megatron --account-for-embedding-in-pipeline-split")
    loss_in_split: bool = Field(
        default=False, description="Megatron --account-for-loss-in-pipeline-split")
    pp_layout: str | None = Field(
        default=None, min_length=1, max_length=4000, pattern=r"^[EtLm|()*0-9, ]+$",
        description="Megatron --pipeline-model-parallel-layout, e.g. 'Et|(tt|)*30,L'")
    stage_layers: tuple[int, ...] | None = Field(
        default=None, min_length=1, max_length=100_000,
        description="decoder layers of each virtual stage (torchtitan module_fqns_per_model_part)")
    recompute_modules: tuple[RecomputeModule, ...] | None = Field(
        default=None, min_length=1,
        description="Megatron --recompute-modules for recompute=selective (default core_attn)")
    recompute_layers: int | None = Field(
        default=None, ge=0, le=10_000,
        description="recompute=full: layers recomputed per virtual stage (Megatron "
        "--recompute-method block --recompute-num-layers); default all")
    offload_layers: int = Field(
        default=0, ge=0, le=10_000,
        description="layers per rank whose activations go to host memory (Megatron "
        "--cpu-offloading-num-layers)")
    dp_shard: int | None = Field(
        default=None, ge=1, le=1_000_000,
        description="ZeRO/FSDP shard group inside dp*cp; the rest replicates (HSDP; default all)")
    reshard_after_forward: bool | None = Field(
        default=None, description="ZeRO-3/FSDP: free gathered parameters after the forward "
        "(default on without pipelining, off under it, as torchtitan's 'default' policy)")

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel degree: the dense grid tp*cp*dp divided by ep*etp."""
        return max(1, (self.tp * self.cp * self.dp) // (self.ep * self.etp))

    @property
    def dp_cp(self) -> int:
        """Ranks that hold the same dense weights: the gradient and ZeRO group (Group.DP_CP)."""
        return self.dp * self.cp

    @property
    def zero_allowed(self) -> bool:
        """ZeRO shards over dp x cp, so it needs more than one rank there."""
        return zero_allowed(self.dp, self.cp)

    def sp_allowed(self, seq_len: int) -> bool:
        """Whether sequence parallelism can run at this tp (see ``sp_allowed``)."""
        return sp_allowed(self.tp, seq_len)

    @property
    def cp_chunks(self) -> int:
        """Chunks context parallelism cuts the sequence into: two per CP rank (load-balanced
        causal attention, Megatron-Core's get_batch_on_this_cp_rank), none without CP."""
        return 2 * self.cp if self.cp > 1 else 1

    @property
    def seq_len_divisor(self) -> int:
        """What the sequence length must be a multiple of: the CP chunks and, with sequence
        parallelism, tp (the sequence is split over the TP ranks)."""
        return math.lcm(self.cp_chunks, self.tp if self.sequence_parallel else 1)

    @property
    def sp_replication(self) -> float:
        """Share of the tensors TP would replicate (norms, dropout, residual) that each rank
        keeps: 1/tp with sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198,
        section 4.2.2), all of them without."""
        return 1.0 / self.tp if self.sequence_parallel else 1.0

    def kv_heads_per_gpu(self, kv_heads: int) -> float:
        """KV heads each TP rank holds: kv/tp, and a whole head when tp exceeds kv (Megatron
        replicates GQA heads then)."""
        return max(kv_heads / self.tp, 1.0)

    @property
    def zero3_per_step(self) -> bool:
        """ZeRO-3 under pipelining: parameters are gathered and gradients reduce-scattered once
        per step (like ZeRO-1), not per micro-batch; DeepSpeed refuses ZeRO-2/3 with its own
        pipeline engine, and FSDP under pipelining keeps the gathered weights unless told to
        reshard after every forward (``reshard=on``)."""
        return self.zero_stage >= 3 and self.pp > 1 and not self.reshards_after_forward

    @property
    def forward_passes(self) -> int:
        """Forward passes a layer runs per micro-batch: two with full recomputation."""
        return 2 if self.recompute == "full" else 1

    def num_microbatches(self, global_batch_size: int) -> int:
        return global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def pipeline_schedule(self) -> str:
        """The schedule the layout runs: its own, else 1F1B or interleaved 1F1B."""
        return self.schedule or default_schedule(self.vpp)

    def pipeline_split(self, num_layers: int) -> PipelineSplit:
        """Decoder layers of every virtual stage (a valid layout; see placer.spec.pipeline)."""
        split = self._split(num_layers)
        if isinstance(split, PipelineSplit):
            return split
        # Not a valid layout (the cost model may still be asked): spread as evenly as possible.
        chunks = self.pp * self.vpp
        base, extra = divmod(num_layers, chunks)
        return PipelineSplit(tuple(base + (1 if c < extra else 0) for c in range(chunks)), self.pp)

    def _split(self, num_layers: int) -> PipelineSplit | tuple[str, object, str]:
        return resolve_split(num_layers, self.pp, self.vpp, first=self.first_stage_layers,
                             last=self.last_stage_layers, embedding=self.embedding_in_split,
                             loss=self.loss_in_split, pp_layout=self.pp_layout,
                             stage_layers=self.stage_layers,
                             v_shape=self.pipeline_schedule in V_SCHEDULES)

    @property
    def zero_group(self) -> int:
        """Ranks the dense ZeRO/FSDP state is sharded over: dp*cp, or the HSDP shard group."""
        return self.dp_shard or self.dp * self.cp

    @property
    def zero_replicas(self) -> int:
        """HSDP replicas of each shard (1 without HSDP)."""
        return (self.dp * self.cp) // self.zero_group

    @property
    def expert_zero_group(self) -> int:
        """Ranks expert state is sharded over: expert-dp, split like the dense group by HSDP."""
        return max(1, self.expert_dp // self.zero_replicas)

    @property
    def effective_zero_stage(self) -> int:
        """ZeRO stage that changes anything: 0 when there is a single rank to shard over
        (Megatron accepts --use-distributed-optimizer on one data-parallel rank; it is a no-op)."""
        return self.zero_stage if self.zero_group > 1 or self.expert_zero_group > 1 else 0

    @property
    def reshards_after_forward(self) -> bool:
        """ZeRO-3 frees gathered parameters after each forward: FSDP2's default, which
        torchtitan's 'default' policy turns off under pipelining (parallelize.py)."""
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.pp == 1

    @classmethod
    def parse(cls, text: str, num_gpus: int | None = None) -> Layout:
        """Parse ``tp=8,pp=4,dp=32,mbs=1,zero=1,recompute=selective,sp=on``.

        A missing ``dp`` is derived from ``num_gpus`` when given.
        """
        values: dict[str, object] = {}
        field = ""
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, sep, raw = part.partition("=")
            if not sep and field == "pp_layout":  # Megatron's layout string has cosmetic commas
                values[field] = f"{values[field]},{part}"
                continue
            key = key.strip().lower()
            if not sep or key not in _SHORT_KEYS:
                raise InputError("--layout", part, f"write key=value pairs, e.g. {LAYOUT_FORM}")
            field = _SHORT_KEYS[key]
            values[field] = _parse_value(field, raw.strip(), part)
        if "dp" not in values and num_gpus is not None:
            denominator = 1
            for key in ("tp", "pp", "cp"):
                denominator *= int(values.get(key, 1))  # type: ignore[call-overload]
            if num_gpus % denominator:
                raise InputError(
                    "--layout", text, f"tp*pp*cp = {denominator} does not divide {num_gpus} GPUs"
                )
            values["dp"] = num_gpus // denominator
        try:
            return cls.model_validate(values)
        except ValidationError as exc:  # a degree out of range, e.g. tp=0
            raise from_validation_error(exc, "--layout", schema="layout") from None

    def compact(self) -> str:
        """The compact string form, every knob spelled out (parse(compact()) == self)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}"]
        if self.ep > 1 or self.etp > 1:
            parts += [f"ep={self.ep}", f"etp={self.etp}"]
        parts += [f"vpp={self.vpp}", f"mbs={self.micro_batch_size}", f"zero={self.zero_stage}",
                  f"recompute={self.recompute}", f"sp={'on' if self.sequence_parallel else 'off'}"]
        parts += self._extra_knobs()
        return ",".join(parts)

    def _extra_knobs(self) -> list[str]:
        """The knobs beyond the degrees, only when they differ from the field's default (short
        forms of older layouts stay; ``reshard=off`` is not a default, so it is kept)."""
        out = []
        for key, field in _EXTRA_KEYS:
            value = getattr(self, field)
            if value is None or value == type(self).model_fields[field].default:
                continue
            if isinstance(value, bool):
                text = "on" if value else "off"
            elif isinstance(value, tuple):
                text = ("+" if field == "recompute_modules" else "/").join(map(str, value))
            else:
                text = str(value)
            out.append(f"{key}={text}")
        return out

    def __str__(self) -> str:
        return self.compact()


_EXTRA_KEYS = (("schedule", "schedule"), ("first", "first_stage_layers"),
               ("last", "last_stage_layers"), ("emb", "embedding_in_split"),
               ("loss", "loss_in_split"), ("pplayout", "pp_layout"), ("stages", "stage_layers"),
               ("rmodules", "recompute_modules"), ("rlayers", "recompute_layers"),
               ("offload", "offload_layers"), ("shard", "dp_shard"),
               ("reshard", "reshard_after_forward"))


def _parse_value(field: str, raw: str, part: str) -> object:
    if field == "pp_layout":
        return raw  # case matters: E, t, L
    raw = raw.lower()
    if field == "recompute":
        if raw not in RECOMPUTE_CHOICES:
            raise InputError("--layout", part,
                             f"recompute is one of {', '.join(RECOMPUTE_CHOICES)}")
        return raw
    if field == "schedule":
        if raw not in SCHEDULES:
            raise InputError("--layout", part, f"schedule is one of {', '.join(SCHEDULES)}")
        return raw
    if field == "recompute_modules":
        modules = tuple(m.strip() for m in raw.split("+") if m.strip())
        unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
        if unknown or not modules:
            raise InputError("--layout", part, "rmodules joins Megatron recompute modules with +: "
                             f"{'+'.join(RECOMPUTE_MODULES)}")
        return modules
    if field == "stage_layers":
        counts = tuple(decimal(c.strip()) for c in raw.split("/"))
        if any(c is None for c in counts):
            raise InputError("--layout", part, "stages lists decoder layers per virtual stage, "
                             "e.g. stages=3/4/4/3")
        return counts
    if field in _BOOLEAN_FIELDS:
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise InputError("--layout", part, f"{part.partition('=')[0].strip()} is on or off")
    value = decimal(raw)
    if value is not None and field in ("recompute_layers", "offload_layers"):
        return value
    if value is None or (value == 0 and field != "zero_stage"):
        raise InputError("--layout", part, f"{field} takes a positive integer")
    return value


def layout_problem(layout: Layout, model: Model, job: Job, num_gpus: int) -> tuple[str, object,
                                                                                     str] | None:
    """The first reason ``layout`` cannot run ``model`` for ``job`` on ``num_gpus`` GPUs.

    Returns ``(field, value, fix)`` or None. This is the one place every degree rule lives (the
    way torchtitan's ParallelDims validates all degrees together); the solver filters with it and
    ``validate_layout`` raises from it.
    """
    t, p, d, c = layout.tp, layout.pp, layout.dp, layout.cp
    if t * p * d * c != num_gpus:
        return ("layout", f"tp*pp*dp*cp={t * p * d * c}",
                f"degrees must multiply to the {num_gpus} GPUs available")
    if model.num_attention_heads % t:
        return ("layout.tp", t, f"must divide num_attention_heads={model.num_attention_heads}")
    kv = model.kv_heads
    if kv % t and t % kv:
        return ("layout.tp", t, f"must divide or be a multiple of num_kv_heads={kv}")
    if layout.vpp > 1 and p == 1:
        return ("layout.vpp", layout.vpp, "virtual stages need pp > 1")
    problem = _pipeline_problem(layout, model)
    if problem is not None:
        return problem
    if job.seq_len % layout.cp_chunks:
        return ("layout.cp", c, f"2*cp must divide seq_len={job.seq_len} (load-balanced CP)")
    if layout.sequence_parallel and not layout.sp_allowed(job.seq_len):
        if t == 1:
            return ("layout.sequence_parallel", True, "sequence parallelism needs tp > 1")
        return ("layout.tp", t, f"with sequence parallelism tp must divide seq_len={job.seq_len}")
    if job.global_batch_size % (d * layout.micro_batch_size):
        return ("layout.micro_batch_size", layout.micro_batch_size,
                f"dp*mbs={d * layout.micro_batch_size} must divide "
                f"global_batch_size={job.global_batch_size}")
    microbatches = layout.num_microbatches(job.global_batch_size)
    if layout.pipeline_schedule == "interleaved" and microbatches % p:
        return ("layout.vpp", layout.vpp,
                f"the interleaved schedule needs microbatches ({microbatches}) divisible by pp={p}")
    if layout.pipeline_schedule == "dualpipe" and microbatches < p:
        return ("layout.schedule", "dualpipe", f"DualPipe needs at least pp={p} micro-batches "
                f"(it has {microbatches})")
    if model.moe is None:
        if layout.ep > 1 or layout.etp > 1:
            return ("layout.ep", layout.ep, f"model {model.name} has no experts; use ep=1,etp=1")
    else:
        if model.moe.num_experts % layout.ep:
            return ("layout.ep", layout.ep,
                    f"must divide num_experts={model.moe.num_experts}")
        if (t * c * d) % (layout.ep * layout.etp):
            return ("layout.ep", layout.ep,
                    f"ep*etp={layout.ep * layout.etp} must divide tp*cp*dp={t * c * d}")
        if model.moe.expert_ffn_hidden_size % layout.etp:
            return ("layout.etp", layout.etp, "must divide moe.expert_ffn_hidden_size")
    problem = _sharding_problem(layout)
    if problem is not None:
        return problem
    for constraint in job.constraints:
        value = _constraint_subject(layout, constraint.key)
        if not constraint.allows(value):
            return (f"layout.{constraint.key}", value, f"the job requires {constraint}")
    if job.stack is not None:
        from placer.spec.stack import load_stack, stack_problem  # the stack refers to Layout

        return stack_problem(layout, load_stack(job.stack), model)
    return None


def _pipeline_problem(layout: Layout, model: Model) -> tuple[str, object, str] | None:
    """Split, schedule and recomputation rules that depend on the layers each stage holds."""
    problem = schedule_problem(layout.pipeline_schedule, layout.pp, layout.vpp)
    if problem is not None:
        return problem
    split = layout._split(model.num_layers)
    if not isinstance(split, PipelineSplit):
        return split
    fewest = min(split.rank_layers)
    if layout.recompute_modules is not None and layout.recompute != "selective":
        return ("layout.recompute_modules", "+".join(layout.recompute_modules),
                "recompute modules need recompute=selective (Megatron --recompute-granularity "
                "selective)")
    if layout.recompute_layers is not None:
        if layout.recompute != "full":
            return ("layout.recompute_layers", layout.recompute_layers,
                    "a recomputed layer count needs recompute=full (Megatron "
                    "--recompute-granularity full --recompute-method block)")
        if layout.recompute_layers > max(split.chunks):
            return ("layout.recompute_layers", layout.recompute_layers,
                    f"a virtual stage holds at most {max(split.chunks)} layers")
    if layout.offload_layers >= fewest and layout.offload_layers > 0:
        return ("layout.offload_layers", layout.offload_layers,
                f"offload fewer layers than the {fewest} the lightest pipeline rank holds "
                "(Megatron: CPU offloading only for layers less than num_layers)")
    return None


def _sharding_problem(layout: Layout) -> tuple[str, object, str] | None:
    """HSDP shard group and FSDP resharding rules."""
    group = layout.dp_cp
    if layout.dp_shard is not None:
        if layout.zero_stage == 0:
            return ("layout.dp_shard", layout.dp_shard, "a shard group needs zero >= 1")
        if group % layout.dp_shard:
            return ("layout.dp_shard", layout.dp_shard, f"must divide dp*cp={group} (HSDP: "
                    "replicas x shard group)")
        if layout.expert_dp % layout.zero_replicas:
            return ("layout.dp_shard", layout.dp_shard, f"the {layout.zero_replicas} replicas must "
                    f"divide expert-dp={layout.expert_dp}")
    if layout.reshard_after_forward is not None and layout.zero_stage < 3:
        return ("layout.reshard_after_forward", layout.reshard_after_forward,
                "resharding after the forward is a ZeRO-3/FSDP choice; set zero=3")
    return None


def pipeline_stage_layers(num_layers: int, pp: int, vpp: int = 1) -> list[int] | None:
    """Transformer layers each pipeline rank holds without an explicit split; None when the
    automatic split is not allowed (placer.spec.pipeline: even; without virtual stages the first
    and last ranks lightest, e.g. Llama 3 405B's 126 layers on 16 stages as 7, 14 x 8, 7; with
    them the embedding and loss counted as layers)."""
    split = resolve_split(num_layers, pp, vpp)
    return split.rank_layers if isinstance(split, PipelineSplit) else None


def _constraint_subject(layout: Layout, key: str) -> int | str:
    if key == "mbs":
        return layout.micro_batch_size
    if key == "zero":
        return layout.zero_stage
    if key == "sp":
        return "on" if layout.sequence_parallel else "off"
    return getattr(layout, key)  # type: ignore[no-any-return]


def validate_layout(layout: Layout, model: Model, job: Job, num_gpus: int) -> None:
    """Raise InputError naming the field, value and fix if the layout cannot run."""
    problem = layout_problem(layout, model, job, num_gpus)
    if problem is not None:
        raise InputError(*problem)
