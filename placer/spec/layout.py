"""Parallel layout: degrees and knobs, its compact string form, and its one validation function.

``tp x pp x dp x cp`` is the GPU count. Experts are spread over a sub-grid of ``dp x cp`` (x ``tp``
when etp = 1), as in Megatron-Core and torchtitan: ``ep x etp`` divides ``tp x cp x dp`` and the
rest is expert data parallelism (``edp``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationError

from placer.errors import InputError, from_validation_error
from placer.spec.base import Spec
from placer.spec.job import Job
from placer.spec.model import Model
from placer.spec.text import decimal

Recompute = Literal["none", "selective", "full"]

# compact key -> field name
_SHORT_KEYS = {
    "tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "etp": "etp", "vpp": "vpp",
    "mbs": "micro_batch_size", "micro_batch_size": "micro_batch_size",
    "zero": "zero_stage", "zero_stage": "zero_stage", "fsdp": "zero_stage",
    "recompute": "recompute", "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
}
_TRUE = {"on", "true", "1", "yes"}
_FALSE = {"off", "false", "0", "no"}
LAYOUT_FORM = "tp=8,pp=4,dp=32,mbs=1,zero=1,recompute=selective,sp=on"


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

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel degree: the dense grid tp*cp*dp divided by ep*etp."""
        return max(1, (self.tp * self.cp * self.dp) // (self.ep * self.etp))

    def num_microbatches(self, global_batch_size: int) -> int:
        return global_batch_size // (self.dp * self.micro_batch_size)

    @classmethod
    def parse(cls, text: str, num_gpus: int | None = None) -> Layout:
        """Parse ``tp=8,pp=4,dp=32,mbs=1,zero=1,recompute=selective,sp=on``.

        A missing ``dp`` is derived from ``num_gpus`` when given.
        """
        values: dict[str, object] = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, sep, raw = part.partition("=")
            key, raw = key.strip().lower(), raw.strip().lower()
            if not sep or key not in _SHORT_KEYS:
                raise InputError("--layout", part, f"write key=value pairs, e.g. {LAYOUT_FORM}")
            field = _SHORT_KEYS[key]
            values[field] = _parse_value(field, raw, part)
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
            raise from_validation_error(exc, "--layout") from None

    def compact(self) -> str:
        """The compact string form, every knob spelled out (parse(compact()) == self)."""
        parts = [f"tp={self.tp}", f"pp={self.pp}", f"dp={self.dp}", f"cp={self.cp}"]
        if self.ep > 1 or self.etp > 1:
            parts += [f"ep={self.ep}", f"etp={self.etp}"]
        parts += [f"vpp={self.vpp}", f"mbs={self.micro_batch_size}", f"zero={self.zero_stage}",
                  f"recompute={self.recompute}", f"sp={'on' if self.sequence_parallel else 'off'}"]
        return ",".join(parts)

    def __str__(self) -> str:
        return self.compact()


def _parse_value(field: str, raw: str, part: str) -> object:
    if field == "recompute":
        if raw not in ("none", "selective", "full"):
            raise InputError("--layout", part, "recompute is none, selective or full")
        return raw
    if field == "sequence_parallel":
        if raw in _TRUE:
            return True
        if raw in _FALSE:
            return False
        raise InputError("--layout", part, "sp is on or off")
    value = decimal(raw)
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
    if pipeline_stage_layers(model.num_layers, p, layout.vpp) is None:
        if layout.vpp > 1:
            return ("layout.vpp", layout.vpp, f"pp*vpp={p * layout.vpp} must divide "
                    f"num_layers={model.num_layers} (uneven pipeline splits need vpp=1)")
        return ("layout.pp", p, f"more stages than num_layers={model.num_layers}")
    if c > 1 and job.seq_len % (2 * c):
        return ("layout.cp", c, f"2*cp must divide seq_len={job.seq_len} (load-balanced CP)")
    if layout.sequence_parallel and t == 1:
        return ("layout.sequence_parallel", True, "sequence parallelism needs tp > 1")
    if job.seq_len % (t if layout.sequence_parallel else 1):
        return ("layout.tp", t, f"with sequence parallelism tp must divide seq_len={job.seq_len}")
    if job.global_batch_size % (d * layout.micro_batch_size):
        return ("layout.micro_batch_size", layout.micro_batch_size,
                f"dp*mbs={d * layout.micro_batch_size} must divide "
                f"global_batch_size={job.global_batch_size}")
    microbatches = layout.num_microbatches(job.global_batch_size)
    if layout.vpp > 1 and microbatches % p:
        return ("layout.vpp", layout.vpp,
                f"the interleaved schedule needs microbatches ({microbatches}) divisible by pp={p}")
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
    if layout.zero_stage > 0 and d * c == 1:
        return ("layout.zero_stage", layout.zero_stage, "ZeRO shards over dp*cp, which is 1")
    for constraint in job.constraints:
        value = _constraint_subject(layout, constraint.key)
        if not constraint.allows(value):
            return (f"layout.{constraint.key}", value, f"the job requires {constraint}")
    return None


def pipeline_stage_layers(num_layers: int, pp: int, vpp: int = 1) -> list[int] | None:
    """Transformer layers each pipeline rank holds; None when the split is not allowed.

    Even when ``pp * vpp`` divides ``num_layers``. Otherwise, without virtual stages, as even as
    possible with the first and last stages the lightest: they also hold the embedding and the
    output layer, and the first keeps the most micro-batches in flight. The extra layers go to
    the middle stages, latest first (Llama 3 405B: 126 layers on 16 stages as 7, 14 x 8, 7,
    Megatron's --decoder-first/last-pipeline-num-layers). Interleaved stages must divide evenly.
    """
    if num_layers % (pp * vpp) == 0:
        return [num_layers // pp] * pp
    if vpp > 1 or pp > num_layers:
        return None
    base, extra = divmod(num_layers, pp)
    layers = [base] * pp
    receivers = list(range(pp - 2, 0, -1)) + [pp - 1]  # middle stages, latest first; then last
    for stage in receivers[:extra]:
        layers[stage] += 1
    return layers


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
